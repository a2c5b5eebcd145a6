"""The ``rainier-sync`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import __version__

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rainier-sync",
        description="Run and manage rainier_sync job queues.",
    )
    parser.add_argument("--version", action="version", version=f"rainier-sync {__version__}")
    parser.add_argument(
        "--app", help="module:attribute of a QueueManager, or of a factory returning one (default: $RAINIER_APP)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and debug logs")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
