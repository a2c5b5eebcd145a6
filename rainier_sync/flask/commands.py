"""``flask queue ...``: the ``rainier-sync queue:*`` commands on the current app's manager.

Each command runs :func:`rainier_sync.cli.main` with a frontend of its own:
the options, output, log lines and exit codes are those of ``rainier-sync``;
messages name the command as typed here (``flask queue work --help``, errors
prefixed ``flask queue: error:``); the manager is the current app's, and
``work`` runs a :class:`~rainier_sync.flask.FlaskWorker`, so every job gets an
app context.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import click
from flask import current_app
from flask.cli import with_appcontext

from .. import cli

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..worker import Worker, WorkerOptions

__all__ = ["queue_group", "current_manager"]

#: Hand every argument to the ``rainier-sync`` parser untouched (``--help`` included).
_PASS_THROUGH: dict[str, Any] = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def current_manager() -> QueueManager:
    """The current app's manager."""
    from . import get_state

    return get_state().manager


class FlaskFrontend(cli.Frontend):
    """The commands as ``flask queue COMMAND``, on the current app's manager."""

    name = "flask queue"
    takes_app = False
    registry_hint = "register the app's jobs (RainierSync(app, registry=...))"

    def command(self, command: str) -> str:
        return f"{self.name} {_FLASK_NAMES.get(command, command.removeprefix('queue:'))}"

    def manager(self, args: argparse.Namespace) -> QueueManager:
        manager = current_manager()
        if not manager.connections:
            raise cli.UsageError("no queue is configured: set QUEUE_DRIVER or RAINIER_QUEUES in app.config")
        return manager

    def worker(self, manager: QueueManager, options: WorkerOptions, connection: str | None) -> Worker:
        from . import FlaskWorker

        app = current_app._get_current_object()  # type: ignore[attr-defined]
        return FlaskWorker(app, manager, options=options, connection=connection)


#: The ``rainier-sync`` commands whose ``flask queue`` name is not theirs without ``queue:``.
_FLASK_NAMES = {"schedule:run": "schedule-run", "schedule:list": "schedule-list", "outbox:relay": "relay"}

_FRONTEND = FlaskFrontend()


@click.group("queue", help="Run and manage this app's rainier_sync job queues (COMMAND --help lists its options).")
def queue_group() -> None:
    pass


def _command(name: str, help: str, command_name: str | None = None) -> None:
    """``flask queue NAME`` running ``rainier-sync COMMAND_NAME`` (default ``queue:NAME``)."""
    full = command_name or f"queue:{name}"

    @queue_group.command(name, help=help, context_settings=_PASS_THROUGH, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    @with_appcontext
    def command(ctx: click.Context, args: tuple[str, ...]) -> None:
        ctx.exit(cli.main([full, *args], frontend=_FRONTEND))


for _name, _help in (
    ("work", "Run jobs, each inside a fresh app context, until stopped (SIGTERM/SIGINT stop it gracefully)."),
    ("health", "A liveness probe: exit 0 while a worker's --health-file is fresh, 1 when it is older or missing."),
    ("failed", "List failed jobs, newest first; with an ID, show that one in full."),
    ("retry", "Queue a failed job (ID) or all of them (all) again."),
    ("forget", "Delete a failed job."),
    ("reclaim", "Make jobs whose reservation lapsed available again."),
    ("status", "Jobs per queue and connection: ready, delayed, reserved, failed."),
    ("migrate", "Create or update the queue's tables."),
    ("pause", "Stop every worker of a connection from claiming jobs of a queue."),
    ("continue", "Let workers claim jobs of a paused queue again."),
):
    _command(_name, _help)

_command(
    "check",
    "Pre-flight: check the app's configuration, registry, schedule, lock store and connections; "
    "exit 0 when all is well, 2 when anything is not.",
    "check",
)
_command("schedule-run", "Dispatch the schedule's ticks that fell due since the last run, then exit.", "schedule:run")
_command("schedule-list", "The schedule's entries, their next run and the tick last dispatched.", "schedule:list")


@queue_group.command(
    "relay",
    help="Publish the jobs committed to the outbox to their connections until stopped (see rainier-sync outbox:relay).",
    context_settings=_PASS_THROUGH,
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
@with_appcontext
def relay_command(ctx: click.Context, args: tuple[str, ...]) -> None:
    ctx.exit(cli.main(["outbox:relay", *args], frontend=_FRONTEND))
