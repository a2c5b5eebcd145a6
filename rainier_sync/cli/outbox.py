"""The outbox's commands: ``outbox:relay``, ``outbox:refused`` (the rows set
aside because their connection refused their job), ``outbox:retry`` and
``outbox:forget``; and the outbox's line in ``queue:status`` and ``check``."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from typing import IO, TYPE_CHECKING, Any

from .app import EXIT_OK, CommandError, Frontend, UsageError
from .output import table

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..outbox import Outbox

__all__ = ["cmd_outbox_relay", "cmd_outbox_refused", "cmd_outbox_retry", "cmd_outbox_forget", "outbox_state"]

log = logging.getLogger("rainier_sync")


def cmd_outbox_relay(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    """``outbox:relay``: publish the outbox's committed jobs until stopped, or once."""
    from ..errors import ConfigurationError
    from ..outbox import Relay

    if args.quiet:
        log.setLevel(logging.WARNING)
    manager = frontend.manager(args)
    options: dict[str, Any] = {"sleep": args.sleep, "batch": args.batch}
    try:
        relay = Relay(manager, **{key: value for key, value in options.items() if value is not None})
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc
    targets = ", ".join(relay.connections)
    if args.once:
        relayed = relay.run_once()
        refused = f", {relay.stats.refused} refused and set aside" if relay.stats.refused else ""
        log.info("outbox relay: %d job(s) relayed to %s%s", relayed, targets, refused)
        return EXIT_OK
    if threading.current_thread() is threading.main_thread():
        relay.install_signal_handlers()
    log.info("outbox relay started: %s to %s", relay.outbox.describe(), targets)
    stats = relay.run()
    log.info(
        "outbox relay stopped: %d relayed, %d duplicate(s) dropped, %d refused", stats.relayed, stats.duplicates,
        stats.refused,
    )  # fmt: skip
    return EXIT_OK


def _outbox(frontend: Frontend, args: argparse.Namespace) -> Outbox:
    outbox = frontend.manager(args).outbox
    if outbox is None:
        raise UsageError(
            "the manager declares no outbox: give QueueManager outbox= (Outbox.from_url(url)), or write "
            "outbox = true on a connection in the queues configuration"
        )
    return outbox


def cmd_outbox_refused(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    """``outbox:refused``: the rows set aside, oldest first."""
    outbox = _outbox(frontend, args)
    rows = outbox.refused(limit=args.limit)
    total = outbox.refused_count()
    if args.json:
        found = [
            {"seq": row.seq, "connection": row.connection, "job": row.job, "error": row.error} for row in rows
        ]
        json.dump(found, out, indent=2)
        out.write("\n")
        return EXIT_OK
    if not rows:
        out.write(f"No rows are set aside in {outbox.describe()}.\n")
        return EXIT_OK
    lines = [
        [
            str(row.seq),
            row.connection,
            str(row.job.get("queue", "?")),
            str(row.job.get("name", "?")),
            str(row.job.get("id", "?")),
            " ".join(row.error.split()),
        ]
        for row in rows
    ]
    table(out, ["ROW", "CONNECTION", "QUEUE", "JOB", "ID", "WHY"], lines, squeeze=5, numeric=(0,))
    if total > len(rows):
        out.write(f"Showing the oldest {len(rows)} of {total} rows set aside (--limit=N shows more).\n")
    retry, forget = frontend.command("outbox:retry"), frontend.command("outbox:forget")
    out.write(f"{retry} ROW|all puts them back for the relay; {forget} ROW gives one up.\n")
    return EXIT_OK


def _row(text: str, frontend: Frontend) -> int:
    try:
        seq = int(text)
    except ValueError:
        raise UsageError(
            f"expected a row number (the ROW column of {frontend.command('outbox:refused')}) or 'all', got {text!r}"
        ) from None
    return seq


def cmd_outbox_retry(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    """``outbox:retry ROW|all``: set-aside rows back in line for the relay."""
    outbox = _outbox(frontend, args)
    seq = None if args.row == "all" else _row(args.row, frontend)
    count = outbox.retry_refused(seq)
    if seq is not None and not count:
        raise _no_row(frontend, seq)
    out.write(f"Put {count} row(s) back in {outbox.describe()}: the relay publishes them next.\n")
    return EXIT_OK


def cmd_outbox_forget(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    """``outbox:forget ROW``: delete a set-aside row (its job is given up)."""
    outbox = _outbox(frontend, args)
    seq = _row(args.row, frontend)
    if not outbox.forget_refused(seq):
        raise _no_row(frontend, seq)
    out.write(f"Forgot row {seq} of {outbox.describe()}.\n")
    return EXIT_OK


def _no_row(frontend: Frontend, seq: int) -> CommandError:
    return CommandError(f"no row {seq} is set aside in the outbox ({frontend.command('outbox:refused')} lists them)")


def outbox_state(manager: QueueManager) -> dict[str, Any] | None:
    """What ``queue:status`` and ``check`` say of the outbox: where it is, the rows
    waiting per connection and the rows set aside (None: no outbox)."""
    outbox = manager.outbox
    if outbox is None:
        return None
    refused_by = outbox.refused_by_connection()
    return {
        "where": outbox.target.where,
        "waiting": outbox.waiting_by_connection(),
        "refused": sum(refused_by.values()),
        "refused_by": refused_by,
    }


def print_outbox(out: IO[str], frontend: Frontend, state: dict[str, Any]) -> None:
    """The outbox's line below ``queue:status``'s table."""
    waiting: dict[str, int] = state["waiting"]
    total = sum(waiting.values())
    each = f" ({', '.join(f'{name} {n}' for name, n in sorted(waiting.items()))})" if waiting else ""
    refused = state["refused"]
    aside = f"; {refused} set aside ({frontend.command('outbox:refused')} lists them)" if refused else ""
    out.write(f"\nOutbox ({state['where']}): {total} waiting for the relay{each}{aside}.\n")
