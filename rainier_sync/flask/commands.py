"""``flask queue ...``: the ``rainier-sync queue:*`` commands on the current app's manager.

``failed``, ``retry``, ``forget``, ``reclaim``, ``status`` and ``migrate`` run
:func:`rainier_sync.cli.main` itself, pointed at the current app's manager, so
their options, output and exit codes are those of ``rainier-sync``. ``work``
parses its options with the same parser and applies the same checks, then
runs a :class:`~rainier_sync.flask.FlaskWorker`, so every job gets an app
context.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import click
from flask import current_app
from flask.cli import with_appcontext

from .. import cli

if TYPE_CHECKING:
    from ..manager import QueueManager

__all__ = ["queue_group", "current_manager"]

log = logging.getLogger("rainier_sync")

#: Hand every argument to the ``rainier-sync`` parser untouched (``--help`` included).
_PASS_THROUGH: dict[str, Any] = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def current_manager() -> QueueManager:
    """The current app's manager: the ``--app`` factory the delegated commands load."""
    from . import get_state

    return get_state().manager


_APP_REFERENCE = f"{__name__}:current_manager"


@click.group("queue", help="Run and manage this app's rainier_sync job queues (see rainier-sync --help).")
def queue_group() -> None:
    pass


def _delegate(name: str, help: str) -> None:
    @queue_group.command(name, help=help, context_settings=_PASS_THROUGH, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    @with_appcontext
    def command(ctx: click.Context, args: tuple[str, ...]) -> None:
        ctx.exit(cli.main([f"queue:{name}", "--app", _APP_REFERENCE, *args]))


for _name, _help in (
    ("failed", "List failed jobs, newest first."),
    ("retry", "Queue a failed job (ID) or all of them (all) again."),
    ("forget", "Delete a failed job."),
    ("reclaim", "Make jobs whose reservation lapsed available again."),
    ("status", "Jobs per queue and connection: ready, delayed, reserved, failed."),
    ("migrate", "Create or update the queue's tables."),
):
    _delegate(_name, _help)


@queue_group.command(
    "work",
    help="Run jobs, each inside a fresh app context, until stopped (SIGTERM/SIGINT stop it gracefully).",
    context_settings=_PASS_THROUGH,
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
@with_appcontext
def work(ctx: click.Context, args: tuple[str, ...]) -> None:
    ctx.exit(_work(list(args)))


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"flask queue: error: {' '.join(message.split())}\n")
    return code


def _work(argv: list[str]) -> int:
    """``rainier-sync queue:work`` with a FlaskWorker; same options, checks and exit codes."""
    from ..errors import ConfigurationError, NoQueueConfiguredError, RainierError, UnknownConnectionError
    from . import FlaskWorker

    app = current_app._get_current_object()  # type: ignore[attr-defined]
    try:
        args = cli.build_parser().parse_args(["queue:work", *argv])
        manager = current_manager()
        if not manager.connections:
            raise NoQueueConfiguredError("no queue is configured: set QUEUE_DRIVER or RAINIER_QUEUES in app.config")
        stats = cli.run_worker(
            manager,
            args,
            lambda m, **kw: FlaskWorker(app, m, **kw),
            registry_hint="register the app's jobs (RainierSync(app, registry=...))",
        )
    except (cli.UsageError, ConfigurationError, UnknownConnectionError, NoQueueConfiguredError) as exc:
        return _fail(str(exc), cli.EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", cli.EXIT_INTERRUPTED)
    except RainierError as exc:
        return _fail(str(exc), cli.EXIT_FAILURE)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        return _fail(f"{type(exc).__name__}: {exc}", cli.EXIT_FAILURE)
    click.echo(
        f"worker stopped: {stats.processed} processed, {stats.released} released, {stats.failed} failed", err=True
    )
    return cli.EXIT_OK
