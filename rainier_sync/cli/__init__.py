"""The ``rainier-sync`` command line (also ``python -m rainier_sync``).

The application is found with ``--app module:attribute`` (before or after the
command) or ``RAINIER_APP``: a :class:`~rainier_sync.QueueManager`, or a
zero-argument factory returning one. With neither, the manager is booted from
the environment (``QUEUE_DRIVER`` and the settings beside it).

An error is one line on stderr and a non-zero exit (:data:`EXIT_FAILURE` when
an operation failed or a backend cannot be reached, :data:`EXIT_USAGE` for bad
usage or configuration); ``-v`` adds the traceback. ``flask queue`` runs the
same commands through a :class:`Frontend` of its own.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from typing import Callable, Sequence

from .._text import escaped
from .app import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Frontend,
    UsageError,
    load_app,
    one_line,
)
from .parser import COMMANDS, build_parser, unrecognized

__all__ = ["main", "load_app", "Frontend", "UsageError", "CommandError", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE",
           "EXIT_INTERRUPTED"]  # fmt: skip

log = logging.getLogger("rainier_sync")


def configure_logging(verbose: bool, command: str) -> Callable[[], None]:
    """Log to stderr unless the application set up logging; returns what puts
    the ``rainier_sync`` logger back (``main`` is also called in-process)."""
    level, handlers = log.level, list(log.handlers)
    running = command in ("queue:work", "outbox:relay")
    log.setLevel(logging.DEBUG if verbose else logging.INFO if running else logging.WARNING)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)

    def restore() -> None:
        log.setLevel(level)
        log.handlers[:] = handlers

    return restore


def main(argv: Sequence[str] | None = None, *, frontend: Frontend | None = None) -> int:
    """Run the command line; returns the exit code. ``frontend`` names the
    program in messages and finds the manager (default: ``rainier-sync``)."""
    from ..errors import (
        ConfigurationError,
        NoQueueConfiguredError,
        QueueUnavailableError,
        RainierError,
        UnknownConnectionError,
    )

    frontend = frontend or Frontend()
    arguments = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in arguments or "--verbose" in arguments
    args: argparse.Namespace | None = None
    restore_logging: Callable[[], None] | None = None
    try:
        parser = build_parser(frontend)
        try:
            args, extras = parser.parse_known_args(arguments)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.command is None:
            parser.print_help(sys.stderr)
            raise UsageError(f"no command given (see {frontend.name} --help)")
        if extras:
            raise unrecognized(parser.commands[args.command], extras)
        verbose = args.verbose
        restore_logging = configure_logging(verbose, args.command)
        return COMMANDS[args.command](frontend, args, sys.stdout)
    except KeyboardInterrupt:
        return fail(frontend, "interrupted", EXIT_INTERRUPTED, verbose)
    except QueueUnavailableError as exc:  # an outage, even when its class derives from ConfigurationError too
        return fail(frontend, str(exc), EXIT_FAILURE, verbose)
    except (UsageError, ConfigurationError, UnknownConnectionError, NoQueueConfiguredError) as exc:
        return fail(frontend, str(exc), EXIT_USAGE, verbose)
    except (CommandError, RainierError) as exc:
        return fail(frontend, str(exc), EXIT_FAILURE, verbose)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, unless -v
        return fail(frontend, f"{one_line(exc)} (-v shows the traceback)", EXIT_FAILURE, verbose)
    finally:
        manager = getattr(args, "booted", None)
        if manager is not None:
            try:
                manager.close()
            except Exception:  # noqa: BLE001 - the command's outcome is what to report
                log.debug("closing the connections failed", exc_info=True)
        if restore_logging is not None:
            restore_logging()


def fail(frontend: Frontend, message: str, code: int, verbose: bool) -> int:
    if verbose:
        traceback.print_exc(file=sys.stderr)
    sys.stderr.write(f"{frontend.name}: error: {escaped(' '.join(message.split()))}\n")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
