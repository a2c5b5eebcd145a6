"""``manage.py queue COMMAND``: the ``rainier-sync`` commands on the manager
Django booted, with their options, output and exit codes.

``rainier-sync queue:work`` is ``manage.py queue work``; ``schedule:run`` is
``schedule-run``; ``outbox:relay`` is ``relay`` (or ``outbox-relay``);
``check`` and ``make:job`` are ``check`` and ``make-job``. ``work`` runs a
:class:`~rainier_sync.django.DjangoWorker`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Sequence

from .. import cli
from ..cli.parser import COMMANDS

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..worker import Worker, WorkerOptions

__all__ = ["DjangoFrontend", "SUBCOMMANDS", "run", "subcommand_name"]

PROGRAM = "manage.py queue"


def subcommand_name(command: str) -> str:
    """How ``manage.py queue`` spells the ``rainier-sync`` command ``command``."""
    return command.removeprefix("queue:").replace(":", "-")


#: ``{manage.py queue name: rainier-sync command}``.
SUBCOMMANDS: dict[str, str] = {subcommand_name(command): command for command in COMMANDS}
SUBCOMMANDS["relay"] = "outbox:relay"


class DjangoFrontend(cli.Frontend):
    """The commands as ``manage.py queue COMMAND``, on the manager Django booted."""

    name = PROGRAM
    takes_app = False
    registry_hint = "put the app's Job classes in a jobs module of an installed app, or list modules in RAINIER_JOBS"

    def command(self, command: str) -> str:
        if command == "outbox:relay":
            return f"{self.name} relay"
        if command == "queue:migrate":
            return f"{self.name} migrate (or manage.py migrate)"
        return f"{self.name} {subcommand_name(command)}"

    def manager(self, args: argparse.Namespace) -> QueueManager:
        from .state import get_manager

        return get_manager()

    def worker(self, manager: QueueManager, options: WorkerOptions, connection: str | None) -> Worker:
        from .hygiene import DjangoWorker

        return DjangoWorker(manager, options=options, connection=connection)


_FRONTEND = DjangoFrontend()


def usage() -> str:
    lines = [f"usage: {PROGRAM} COMMAND [options]  ({PROGRAM} COMMAND --help lists its options)", "", "commands:"]
    for name, command in sorted(SUBCOMMANDS.items()):
        lines.append(f"  {name:<16} (rainier-sync {command})")
    return "\n".join(lines) + "\n"


def run(argv: Sequence[str]) -> int:
    """Run ``manage.py queue`` with ``argv`` (what follows ``queue``); returns the exit code."""
    args = list(argv)
    options = [arg for arg in args if arg.startswith("-")]
    first = next((index for index, arg in enumerate(args) if not arg.startswith("-")), None)
    if first is None:
        if any(option in ("-h", "--help") for option in options):
            sys.stdout.write(usage())
            return cli.EXIT_OK
        sys.stderr.write(usage())
        sys.stderr.write(f"{PROGRAM}: error: no command given\n")
        return cli.EXIT_USAGE
    name = args[first]
    command = SUBCOMMANDS.get(name)
    if command is None:
        from ..config.schema import suggest

        sys.stderr.write(
            f"{PROGRAM}: error: unknown command {name!r}{suggest(name, sorted(SUBCOMMANDS))} "
            f"(see {PROGRAM} --help)\n"
        )
        return cli.EXIT_USAGE
    return cli.main([*args[:first], command, *args[first + 1 :]], frontend=_FRONTEND)
