"""``check``: a pre-flight for CI and deploy pipelines.

Loads the application and looks at what would otherwise fail only once a
worker runs: the configuration, the job registry, the schedule, the lock
store and every connection. Each finding is one line, ``ok: ...`` or
``problem: ...``; the exit is :data:`~rainier_sync.cli.EXIT_OK` when every
finding is ok, :data:`~rainier_sync.cli.EXIT_USAGE` (2) when any is not.
"""

from __future__ import annotations

import argparse
import math
from typing import IO, TYPE_CHECKING

from ..state.base import STORE_HINT
from .app import EXIT_OK, EXIT_USAGE, Frontend, UsageError, one_line

if TYPE_CHECKING:
    from ..manager import QueueManager

__all__ = ["cmd_check", "PROBE_KEY"]

#: The key the lock store is asked about: nothing ever holds it.
PROBE_KEY = "rainier:check"



class Findings:
    """The lines ``check`` prints, and whether any was a problem."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.problems = 0

    def ok(self, text: str) -> None:
        self.out.write(f"ok: {text}\n")

    def problem(self, text: str) -> None:
        self.problems += 1
        self.out.write(f"problem: {' '.join(text.split())}\n")


def cmd_check(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from ..errors import RainierError

    findings = Findings(out)
    try:
        manager = frontend.manager(args)
    except Exception as exc:  # noqa: BLE001 - an app that does not build is the first thing to report
        known = isinstance(exc, (UsageError, RainierError)) and str(exc)
        findings.problem(f"configuration: {exc if known else one_line(exc)}")
        return EXIT_USAGE
    described = ", ".join(f"{name} ({driver.kind})" for name, driver in manager.connections.items())
    findings.ok(f"configuration: connections {described}; default {manager.default}")
    _registry(frontend, manager, findings)
    _schedule(manager, findings)
    _lock_store(manager, findings)
    _connections(frontend, manager, findings)
    _outbox(frontend, manager, findings)
    return EXIT_USAGE if findings.problems else EXIT_OK


def _registry(frontend: Frontend, manager: QueueManager, findings: Findings) -> None:
    registry = manager.registry
    if not len(registry):
        findings.problem(f"registry: no job is registered, so a worker would fail every job as unknown: "
                         f"{frontend.registry_hint}")  # fmt: skip
        return
    findings.ok(f"registry: {len(registry)} job(s) registered")
    reserving = [(name, driver) for name, driver in manager.connections.items() if driver.reservation is not None]
    for name, driver in reserving:
        if not driver.capabilities.renews:
            findings.problem(
                f"connection {name} ({driver.describe()}) reserves jobs but cannot renew reservations: "
                "a worker refuses it, since a job running longer than its reservation would reach a second worker"
            )
    for cls in registry.classes():
        timeout = cls.TIMEOUT
        if timeout is None:
            continue
        for name, driver in reserving:
            reservation = driver.reservation
            assert reservation is not None
            if timeout > reservation:
                findings.problem(
                    f"job {cls.NAME}: TIMEOUT {timeout:g}s exceeds the reservation of connection {name} "
                    f"({reservation:g}s): a worker that cannot renew it for that long (stalled, or cut off from "
                    f"the backend) lets a second worker run the job too; set the reservation above "
                    f"{timeout:g}s, e.g. {math.ceil(timeout * 1.5)}"
                )
    needing = registry.needing_a_store()
    if needing:
        names = ", ".join(sorted(cls.NAME for cls in needing))
        if manager.locks is None:
            findings.problem(
                f"registry: jobs {names} keep state in a lock store (middleware, KEEP_RESULT), and the manager "
                f"has none: {STORE_HINT}"
            )
        else:
            findings.ok(f"registry: jobs {names} keep state in the lock store")


def _schedule(manager: QueueManager, findings: Findings) -> None:
    schedule = manager.schedule
    if schedule is None or not len(schedule):
        return
    entries = list(schedule)
    unregistered = [entry for entry in entries if manager.registry.find(type(entry.job).NAME) is None]
    for entry in unregistered:
        findings.problem(f"schedule entry {entry.name!r}: job {type(entry.job).NAME!r} is not registered")
    if manager.locks is None:
        findings.problem(
            f"schedule: {len(entries)} entries but no lock store to dispatch each tick once across schedulers: "
            f"{STORE_HINT}"
        )
    elif not unregistered:
        findings.ok(f"schedule: {len(entries)} entries, each job registered")


def _lock_store(manager: QueueManager, findings: Findings) -> None:
    locks = manager.locks
    if locks is None:
        return
    kind = type(locks).__name__
    try:
        locks.owner(PROBE_KEY)
    except Exception as exc:  # noqa: BLE001 - reported as a finding
        findings.problem(f"lock store ({kind}): {one_line(exc)}")
        return
    # Workers read paused queues from the store's flags every few seconds, and
    # middleware and the schedule keep their windows and counters beside them:
    # a database store without its coordination tables (migration 2) fails here.
    try:
        locks.flags(PROBE_KEY)
    except Exception as exc:  # noqa: BLE001 - reported as a finding
        findings.problem(
            f"lock store ({kind}) cannot keep flags, which paused queues, job middleware and the schedule "
            f"need: {exc if str(exc) else one_line(exc)}"
        )
        return
    findings.ok(f"lock store ({kind}): reachable, keeps flags")


def _connections(frontend: Frontend, manager: QueueManager, findings: Findings) -> None:
    from ..errors import SchemaMissingError

    migrate = frontend.command("queue:migrate")
    for name, driver in manager.connections.items():
        where = f"connection {name} ({driver.kind})"
        if not driver.promises.deferred:
            findings.ok(f"{where}: runs jobs inline")
            continue
        try:
            driver.counts("default")
        except SchemaMissingError as exc:
            text = str(exc)
            findings.problem(f"{where}: {text}" if "queue:migrate" in text else f"{where}: {text}; run {migrate}")
        except Exception as exc:  # noqa: BLE001 - reported as a finding
            findings.problem(f"{where}: cannot be reached: {one_line(exc)}")
        else:
            findings.ok(f"{where}: reachable")


def _outbox(frontend: Frontend, manager: QueueManager, findings: Findings) -> None:
    """The outbox's table is there, and no row in it is set aside."""
    from ..errors import SchemaMissingError
    from .outbox import outbox_state

    if manager.outbox is None:
        return
    where = f"outbox ({manager.outbox.target.where})"
    try:
        state = outbox_state(manager)
    except SchemaMissingError as exc:
        findings.problem(f"{where}: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - reported as a finding
        findings.problem(f"{where}: cannot be reached: {one_line(exc)}")
        return
    assert state is not None
    waiting = sum(state["waiting"].values())
    if state["refused"]:
        findings.problem(
            f"{where}: {state['refused']} row(s) set aside, refused by their connection or unreadable (their jobs "
            f"wait for you: {frontend.command('outbox:refused')} lists them and why, "
            f"{frontend.command('outbox:retry')} puts them back)"
        )
    else:
        findings.ok(f"{where}: reachable, {waiting} job(s) waiting for the relay, none set aside")
