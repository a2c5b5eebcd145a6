"""``manage.py queue COMMAND``: see :mod:`rainier_sync.django.commands`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...commands import run, usage

#: Django's own options, already applied by ``manage.py`` before this command runs.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


def _without_django_options(argv: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _DJANGO_OPTIONS:
            skip = True
            continue
        if any(arg.startswith(option + "=") for option in _DJANGO_OPTIONS):
            continue
        kept.append(arg)
    return kept


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run and manage rainier_sync job queues: " + usage()
    requires_system_checks: list[str] = []

    def run_from_argv(self, argv: list[str]) -> None:
        """Hand everything after ``queue`` to the ``rainier-sync`` parser, and
        exit with its code."""
        code = run(_without_django_options(argv[2:]))
        sys.stdout.flush()
        sys.exit(code)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        """``call_command("queue", "status")``: raises ``CommandError`` on a non-zero exit."""
        code = run(list(args))
        if code:
            raise CommandError(f"manage.py queue {' '.join(args)} exited {code}", returncode=code)
