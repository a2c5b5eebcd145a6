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
import difflib
import importlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, NoReturn, Sequence

from . import __version__

if TYPE_CHECKING:
    from .drivers.base import BaseQueue
    from .manager import QueueManager
    from .types import FailedJob
    from .worker import Worker, WorkerOptions, WorkerStats

__all__ = ["main", "load_app", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED"]

#: The command did what it was asked.
EXIT_OK = 0
#: An operation failed (a backend error or one that cannot be reached, a failed job id nobody has,
#: a file in the way, a job that failed for good under ``queue:work --fail-on-failed``).
EXIT_FAILURE = 1
#: Bad usage or configuration: a wrong option, an ``--app`` that does not load, a refused setting.
EXIT_USAGE = 2
#: Interrupted by Ctrl-C (outside ``queue:work``, which stops gracefully and exits 0).
EXIT_INTERRUPTED = 130

log = logging.getLogger("rainier_sync")


class UsageError(Exception):
    """Bad usage or configuration (exit 2)."""


class CommandError(Exception):
    """The command could not do what it was asked (exit 1)."""


class _Parser(argparse.ArgumentParser):
    #: The parser of each command, by name (on the top-level parser).
    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.dest == "command" and action.choices is not None and value not in action.choices:
            names = list(action.choices)
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (commands: {', '.join(names)})"
            raise argparse.ArgumentError(None, f"unknown command {value!r}{hint}")
        super()._check_value(action, value)


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> UsageError:
    """The first argument ``parser`` did not take, with the option it most likely meant."""
    first = extras[0]
    if not first.startswith("-") or first == "-":
        return UsageError(f"unrecognized argument {first!r} (see {parser.prog} --help)")
    option = first.split("=", 1)[0]
    known = [name for action in parser._actions for name in action.option_strings]
    close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UsageError(f"unrecognized option {option!r}{hint} (see {parser.prog} --help)")


class Frontend:
    """How the commands are reached: as ``rainier-sync`` (this class), or as
    ``flask queue`` on a Flask app's manager. Commands, options, output and
    exit codes are the same; the names in messages, where the manager comes
    from and the worker class differ."""

    #: The program as the user types it; every error line starts with ``<name>: error:``.
    name = "rainier-sync"
    #: Whether ``--app`` names the application (``flask`` has an ``--app`` of its own).
    takes_app = True
    #: What ``queue:work`` says to do about an empty job registry.
    registry_hint = "pass --app module:attribute (or set RAINIER_APP) naming the application that registers its jobs"

    def command(self, command: str) -> str:
        """How the user types ``command`` (``queue:failed``), program included."""
        return f"{self.name} {command}"

    def manager(self, args: argparse.Namespace) -> QueueManager:
        """The manager the command works on."""
        return _manager(args)

    def worker(self, manager: QueueManager, options: WorkerOptions, connection: str | None) -> Worker:
        """The worker ``queue:work`` runs."""
        from .worker import Worker

        return Worker(manager, options=options, connection=connection)


# -- finding the application ----------------------------------------------------------------


def load_app(reference: str, origin: str = "--app") -> QueueManager:
    """The QueueManager ``module:attribute`` names: the manager itself, or what
    a zero-argument factory there returns."""
    from .errors import ConfigurationError
    from .manager import QueueManager

    module_name, colon, attribute = reference.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"{origin} {reference!r} must be module:attribute, e.g. myapp.queues:manager")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script does not put the working directory on the path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(f"{origin} {reference}: no module named {exc.name!r} (is it on PYTHONPATH?)") from exc
        raise UsageError(f"{origin} {reference}: importing {module_name!r} failed: {_one_line(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - whatever the module raised, say so in one line
        raise UsageError(f"{origin} {reference}: importing {module_name!r} failed: {_one_line(exc)}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{origin} {reference}: module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(target, QueueManager):
        return target
    if isinstance(target, type) or not callable(target):
        raise UsageError(
            f"{origin} {reference} is {_a(target)}, not a QueueManager or a zero-argument factory returning one"
        )
    try:
        result = target()
    except ConfigurationError:
        raise
    except TypeError as exc:
        raise UsageError(f"{origin} {reference}: calling the factory with no arguments failed: {exc}") from exc
    if not isinstance(result, QueueManager):
        raise UsageError(
            f"{origin} {reference} returned an object of type {type(result).__qualname__}, not a QueueManager"
        )
    return result


def _a(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    return f"of type {type(value).__qualname__}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _manager(args: argparse.Namespace) -> QueueManager:
    from .manager import QueueManager, set_instance

    reference = getattr(args, "app", None)
    origin = "--app"
    if not reference:
        reference, origin = os.environ.get("RAINIER_APP", "").strip(), "RAINIER_APP"
    if reference:
        manager = load_app(reference, origin)
        set_instance(manager)
    else:
        manager = QueueManager.from_env()
        args.booted = manager  # built here, so closed here; an application's manager is its own to close
    if not manager.connections:
        raise UsageError("no queue is configured: pass --app module:attribute, set RAINIER_APP, or set QUEUE_DRIVER")
    return manager


def _selected(manager: QueueManager, name: str | None) -> list[tuple[str, BaseQueue]]:
    if name is not None:
        return [(name, manager.connection(name))]
    return list(manager.connections.items())


# -- commands ------------------------------------------------------------------------------------


def cmd_work(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    stats = run_worker(frontend, frontend.manager(args), args)
    summary = f"worker stopped: {stats.processed} processed, {stats.released} released, {stats.failed} failed"
    for count, what in ((stats.discarded, "unreadable"), (stats.interrupted, "interrupted")):
        if count:
            summary += f", {count} {what}"
    lost = stats.failed + stats.discarded
    if args.fail_on_failed and lost:
        log.warning("%s; exit 1: %d job(s) failed for good (--fail-on-failed)", summary, lost)
        return EXIT_FAILURE
    log.info("%s", summary)
    return EXIT_OK


def run_worker(frontend: Frontend, manager: QueueManager, args: argparse.Namespace) -> WorkerStats:
    """The body of ``queue:work`` once a manager is at hand: checks, options, signals, run."""
    from .errors import ConfigurationError
    from .worker import WorkerOptions

    if args.quiet:
        log.setLevel(logging.WARNING)
    if args.fail_on_failed and not (args.once or args.max_jobs):
        raise UsageError(
            "--fail-on-failed needs --once or --max-jobs: a worker that runs until stopped has no run to judge "
            f"(see {frontend.command('queue:work')} --help)"
        )
    driver = manager.connection(args.connection)
    name = args.connection or manager.default
    if not driver.driver.needs_a_worker():
        raise UsageError(f"connection {name!r} is {driver.kind}: it runs jobs inline, there is nothing to work")
    if not len(manager.registry):
        raise UsageError(f"the job registry is empty, so every job would fail as unknown: {frontend.registry_hint}")
    given = {
        "queues": args.queue,
        "once": args.once or None,
        "max_jobs": args.max_jobs,
        "sleep": args.sleep,
        "concurrency": args.concurrency,
        "timeout": args.timeout,
        "connection": args.connection,
        "child_setup": args.child_setup,
        "prefetch": args.prefetch,
        "give_up": args.give_up,
    }
    try:
        options = WorkerOptions(**{key: value for key, value in given.items() if value is not None})
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc
    if driver.capabilities.eviction_check:
        driver.check_eviction_policy()  # logs a warning unless the backend refuses writes rather than evicting jobs
    worker = frontend.worker(manager, options, args.connection)
    if threading.current_thread() is threading.main_thread():
        worker.install_signal_handlers()
    log.info(
        "worker started: connection %s (%s), queues %s, concurrency %d%s",
        name,
        driver.kind,
        ",".join(options.queues),
        options.concurrency,
        ", once" if options.once else "",
    )
    return worker.run()


def cmd_failed(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    selected = _selected(manager, args.connection)
    if args.id is not None:
        for _, driver in selected:
            one = driver.failed_job(args.id)
            if one is not None:
                if args.json:
                    json.dump(_failed_dict(one), out, indent=2)
                    out.write("\n")
                else:
                    _show_failed(out, one)
                return EXIT_OK
        raise _no_failed_job(frontend, args.id)
    found: list[FailedJob] = []
    total = 0
    for _, driver in selected:
        found.extend(driver.failed_jobs(limit=args.limit))
        total += driver.failed_count()
    found.sort(key=lambda failed: failed.failed_at, reverse=True)
    found = found[: args.limit]
    if args.json:
        json.dump([_failed_dict(failed) for failed in found], out, indent=2)
        out.write("\n")
        return EXIT_OK
    if not found:
        out.write("No failed jobs.\n")
        return EXIT_OK
    rows = [
        [
            failed.id,
            failed.connection,
            failed.queue,
            failed.name,
            _when(failed.failed_at),
            f"{failed.attempts}/{failed.max_attempts}",
            " ".join(failed.error.split()),
        ]
        for failed in found
    ]
    _table(out, ["ID", "CONNECTION", "QUEUE", "JOB", "FAILED AT (UTC)", "TRIES", "ERROR"], rows, squeeze=6)
    if total > len(found):
        out.write(f"Showing the newest {len(found)} of {total} failed jobs (--limit=N shows more).\n")
    return EXIT_OK


def _no_failed_job(frontend: Frontend, job_id: str) -> CommandError:
    return CommandError(f"no failed job has id {job_id!r} ({frontend.command('queue:failed')} lists them)")


def _failed_dict(failed: FailedJob) -> dict[str, Any]:
    return {
        "id": failed.id,
        "connection": failed.connection,
        "queue": failed.queue,
        "name": failed.name,
        "failed_at": _when(failed.failed_at),
        "attempts": failed.attempts,
        "max_attempts": failed.max_attempts,
        "error": failed.error,
        "exception": failed.exception.to_dict(),
        "payload": failed.payload,
    }


def _show_failed(out: IO[str], failed: FailedJob) -> None:
    """One failed job in full: its fields, the exception record, the payload and the traceback."""
    info = failed.exception
    fields = [
        ("ID", failed.id),
        ("Connection", failed.connection),
        ("Queue", failed.queue),
        ("Job", failed.name),
        ("Failed at", f"{_when(failed.failed_at)} UTC"),
        ("Tries", f"{failed.attempts}/{failed.max_attempts}"),
        ("Error", failed.error),
        *(
            ("Caused by" if index == 0 else "", f"{kind}: {message}")
            for index, (kind, message) in enumerate(info.causes)
        ),
        ("Timed out", "yes" if info.timed_out else "no"),
        ("Crashed", "yes" if info.crashed else "no"),
    ]
    width = max(len(label) for label, _ in fields) + 2
    for label, value in fields:
        first, *rest = value.splitlines() or [""]
        out.write(f"{label.ljust(width)}{first}".rstrip() + "\n")
        for line in rest:
            out.write(f"{' ' * width}{line}".rstrip() + "\n")
    out.write("\nPayload:\n")
    out.write(json.dumps(failed.payload, indent=2) + "\n")
    out.write("\nTraceback:\n")
    out.write(info.traceback if info.traceback.endswith("\n") else f"{info.traceback or '(none recorded)'}\n")


def cmd_retry(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from .errors import UniqueLockHeldError

    manager = frontend.manager(args)
    selected = _selected(manager, args.connection)
    if args.id != "all":
        for name, _ in selected:
            if manager.retry_failed(args.id, connection=name):
                out.write(f"Queued failed job {args.id} again on connection {name}.\n")
                return EXIT_OK
        raise _no_failed_job(frontend, args.id)
    # Ids first, so a job that is retried and fails again meanwhile is not retried twice.
    pending: list[tuple[str, str]] = []
    for name, driver in selected:
        pending.extend((name, failed.id) for failed in driver.failed_jobs(limit=max(driver.failed_count(), 1)))
    progress = _Progress("Retrying", len(pending))
    retried = gone = 0
    held: list[str] = []
    for done, (name, job_id) in enumerate(pending, 1):
        try:
            if manager.retry_failed(job_id, connection=name):
                retried += 1
            else:
                gone += 1
        except UniqueLockHeldError as exc:
            held.append(str(exc))
        progress.update(done)
    progress.finish()
    notes = [f"{gone} were already gone"] if gone else []
    if held:
        notes.append(f"{len(held)} kept: a live copy holds their unique lock")
    note = f" ({'; '.join(notes)})" if notes else ""
    out.write(f"Queued {retried} failed job(s) again{note}.\n")
    for line in held:
        out.write(f"  {line}\n")
    return EXIT_OK


def cmd_forget(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    for name, driver in _selected(manager, args.connection):
        if driver.forget_failed(args.id):
            out.write(f"Forgot failed job {args.id} on connection {name}.\n")
            return EXIT_OK
    raise _no_failed_job(frontend, args.id)


def cmd_reclaim(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    for name, driver in _selected(manager, args.connection):
        out.write(f"{name} ({driver.kind}): {driver.reclaim_expired()} lapsed reservation(s) reclaimed\n")
    return EXIT_OK


def cmd_status(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    wanted = [q for q in (args.queue or "").split(",") if q]
    report: list[dict[str, Any]] = []
    for name, driver in _selected(manager, args.connection):
        entry: dict[str, Any] = {"connection": name, "driver": driver.kind, "queues": {}, "failed": 0}
        if driver.driver.is_deferred():
            for queue in dict.fromkeys([*wanted, *sorted(driver.queue_names())]):
                counts = driver.counts(queue)
                entry["queues"][queue] = {
                    "ready": counts.ready,
                    "delayed": counts.delayed,
                    "reserved": counts.reserved,
                    "total": counts.total,
                }
        entry["failed"] = driver.failed_count()
        report.append(entry)
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
        return EXIT_OK
    rows: list[list[str]] = []
    for entry in report:
        if entry["driver"] == "sync":
            rows.append([entry["connection"], "sync", "(runs jobs inline)", "", "", "", "", str(entry["failed"])])
            continue
        if not entry["queues"]:
            rows.append([entry["connection"], entry["driver"], "(no jobs)", "0", "0", "0", "0", str(entry["failed"])])
        for index, (queue, c) in enumerate(entry["queues"].items()):
            failed = str(entry["failed"]) if index == 0 else ""
            sizes = [str(c["ready"]), str(c["delayed"]), str(c["reserved"]), str(c["total"])]
            rows.append([entry["connection"], entry["driver"], queue, *sizes, failed])
    headers = ["CONNECTION", "DRIVER", "QUEUE", "READY", "DELAYED", "RESERVED", "TOTAL", "FAILED"]
    _table(out, headers, rows, numeric=range(3, 8))
    return EXIT_OK


def cmd_migrate(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    for name, driver in _selected(manager, args.connection):
        if not driver.capabilities.migrations:
            out.write(f"{name} ({driver.kind}): nothing to migrate\n")
            continue
        applied = driver.migrate()
        detail = f"applied migration(s) {', '.join(map(str, applied))}" if applied else "already up to date"
        out.write(f"{name} ({driver.kind}): {detail}\n")
    return EXIT_OK


def cmd_make_job(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from .templates import render_job, render_test, scaffold

    try:
        job = scaffold(args.name, prefix=args.prefix)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    root = Path.cwd().resolve()
    package = (root / args.path).resolve()
    tests = (root / args.tests).resolve()
    for option, folder in (("--path", package), ("--tests", tests)):
        if folder != root and root not in folder.parents:
            raise UsageError(f"{option} must be inside the current directory, got {folder}")
    module_file, test_file = package / f"{job.stem}.py", tests / f"test_{job.stem}.py"
    for target in (module_file, test_file):
        if target.exists():
            raise CommandError(f"{target.relative_to(root)} already exists; not overwriting it")
    module = ".".join([*package.relative_to(root).parts, job.stem])
    if not all(part.isidentifier() for part in module.split(".")):
        raise UsageError(f"--path {args.path!r} is not an importable package path")
    for folder in (package, tests):
        _make_package(root, folder)
    module_file.write_text(render_job(job, args.queue), encoding="utf-8")
    test_file.write_text(render_test(job, module), encoding="utf-8")
    out.write(f"Wrote {module_file.relative_to(root)} ({job.cls}, NAME {job.wire!r})\n")
    out.write(f"Wrote {test_file.relative_to(root)}\n")
    out.write(f"Register it with JobRegistry().with_job({job.cls}); test it with: python -m pytest {args.tests}\n")
    return EXIT_OK


def _make_package(root: Path, folder: Path) -> None:
    """Create ``folder`` and, in each directory created, an ``__init__.py``."""
    missing: list[Path] = []
    current = folder
    while current != root and not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir()
        (directory / "__init__.py").write_text("", encoding="utf-8")


# -- output helpers ------------------------------------------------------------------------------


#: How much of a long cell (a failed job's error) a list shows off a terminal.
_SQUEEZED_WIDTH = 100


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(
    out: IO[str],
    headers: list[str],
    rows: list[list[str]],
    *,
    squeeze: int | None = None,
    numeric: Sequence[int] = (),
) -> None:
    """Columns padded to fit; column ``squeeze`` is cut to the terminal's width
    (off a terminal, to :data:`_SQUEEZED_WIDTH` characters)."""
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    if squeeze is not None:
        room = _SQUEEZED_WIDTH
        if out.isatty():
            room = max(20, shutil.get_terminal_size((120, 24)).columns - sum(w + 2 for w in widths[:squeeze]))
        widths[squeeze] = max(len(headers[squeeze]), min(widths[squeeze], room))
        for row in rows:
            if len(row[squeeze]) > widths[squeeze]:
                row[squeeze] = row[squeeze][: widths[squeeze] - 3] + "..."

    def line(cells: list[str]) -> str:
        parts = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        return "  ".join(parts).rstrip() + "\n"

    out.write(line(headers))
    for row in rows:
        out.write(line(row))


class _Progress:
    """``label: done/total`` redrawn on a terminal (stderr), silent otherwise."""

    def __init__(self, label: str, total: int, stream: IO[str] | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = total > 0 and self.stream.isatty()
        self._last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or done == self.total):
            self._last = now
            self.stream.write(f"\r{self.label}: {done}/{self.total} ({100 * done // self.total}%)")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


# -- the parser ------------------------------------------------------------------------------------

_COMMANDS: dict[str, Callable[[Frontend, argparse.Namespace, IO[str]], int]] = {
    "queue:work": cmd_work,
    "queue:failed": cmd_failed,
    "queue:retry": cmd_retry,
    "queue:forget": cmd_forget,
    "queue:reclaim": cmd_reclaim,
    "queue:status": cmd_status,
    "queue:migrate": cmd_migrate,
    "make:job": cmd_make_job,
}


def _int_from(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_from(1)
_whole = _int_from(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return value


def build_parser(frontend: Frontend | None = None) -> _Parser:
    """The argument parser of every command, named as ``frontend`` (default: ``rainier-sync``) names them."""
    frontend = frontend or Frontend()
    app_help = "module:attribute of a QueueManager, or of a factory returning one (default: $RAINIER_APP)"
    # Accepted before and after the command; SUPPRESS keeps a subcommand from resetting what came before it.
    common = _Parser(add_help=False)
    if frontend.takes_app:
        common.add_argument("--app", metavar="MODULE:ATTR", default=argparse.SUPPRESS, help=app_help)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = _Parser(
        prog=frontend.name,
        description="Run and manage rainier_sync job queues.",
        epilog="Exit codes: 0 done, 1 an operation failed (or a backend cannot be reached), "
        "2 bad usage or configuration, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"rainier-sync {__version__}")
    if frontend.takes_app:
        parser.add_argument("--app", metavar="MODULE:ATTR", help=app_help)
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.commands = {}

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, parents=[common], prog=frontend.command(name))
        parser.commands[name] = sub
        return sub

    def connection_option(sub: argparse.ArgumentParser, what: str) -> None:
        sub.add_argument("--connection", metavar="NAME", help=f"only this connection (default: {what})")

    work = command("queue:work", "Run jobs until stopped (SIGTERM/SIGINT stop it gracefully).")
    work.add_argument("--queue", metavar="A,B", help="queues in priority order (default: default)")
    work.add_argument("--once", action="store_true", help="run what is due, then exit")
    work.add_argument(
        "--fail-on-failed",
        action="store_true",
        help="with --once or --max-jobs: exit 1 when a job of this run failed for good",
    )
    work.add_argument(
        "--give-up",
        type=_seconds,
        metavar="SECONDS",
        help="with --once: exit 1 once the backend has kept failing this long (default: 30)",
    )
    work.add_argument("--max-jobs", type=_positive_int, metavar="N", help="exit after taking N jobs")
    work.add_argument("--sleep", type=_seconds, metavar="SECONDS", help="longest idle wait (default: 1)")
    work.add_argument("--concurrency", type=_positive_int, metavar="N", help="threads running jobs (default: 8)")
    work.add_argument(
        "--prefetch",
        type=_whole,
        metavar="N",
        help="most jobs claimed ahead of the threads when jobs are short (default: 8 per thread; 0: none)",
    )
    work.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="time limit of a job with no TIMEOUT")
    work.add_argument("--connection", metavar="NAME", help="the connection to work (default: the default one)")
    work.add_argument(
        "--child-setup",
        metavar="MODULE:FUNCTION",
        help="called in each new timeout child before its first attempt (see the timeouts docs)",
    )
    work.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")

    failed = command("queue:failed", "List failed jobs, newest first; with an ID, show that one in full.")
    failed.add_argument("id", nargs="?", metavar="ID", help="a failed job's id: show it whole, traceback included")
    failed.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N (default: 50)")
    connection_option(failed, "all")
    failed.add_argument("--json", action="store_true", help="print JSON (with the exception record) instead")

    retry = command("queue:retry", "Queue a failed job again, or all of them.")
    retry.add_argument("id", metavar="ID|all", help="a failed job's id, or 'all'")
    connection_option(retry, "all")

    forget = command("queue:forget", "Delete a failed job.")
    forget.add_argument("id", metavar="ID", help="the failed job's id")
    connection_option(forget, "all")

    reclaim = command("queue:reclaim", "Make jobs whose reservation lapsed available again.")
    connection_option(reclaim, "all")

    status = command("queue:status", "Jobs per queue and connection: ready, delayed, reserved, failed.")
    status.add_argument("--queue", metavar="A,B", help="always list these queues")
    connection_option(status, "all")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    migrate = command("queue:migrate", "Create or update the queue's tables on every connection that has them.")
    connection_option(migrate, "all")

    make = command("make:job", "Write a job module and its test.")
    make.add_argument("name", metavar="Name", help="the job class, e.g. SendInvoice")
    make.add_argument("--path", default="jobs", help="package directory for the module (default: jobs)")
    make.add_argument("--tests", default="tests", help="directory for the test (default: tests)")
    make.add_argument("--queue", default="default", help="the job's QUEUE (default: default)")
    make.add_argument("--prefix", default="app", help="domain prefix of the wire NAME (default: app)")
    return parser


def _configure_logging(verbose: bool, command: str) -> Callable[[], None]:
    """Log to stderr unless the application set up logging; returns what puts
    the ``rainier_sync`` logger back (``main`` is also called in-process)."""
    level, handlers = log.level, list(log.handlers)
    log.setLevel(logging.DEBUG if verbose else logging.INFO if command == "queue:work" else logging.WARNING)
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
    from .errors import (
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
            raise _unrecognized(parser.commands[args.command], extras)
        verbose = args.verbose
        restore_logging = _configure_logging(verbose, args.command)
        return _COMMANDS[args.command](frontend, args, sys.stdout)
    except KeyboardInterrupt:
        return _fail(frontend, "interrupted", EXIT_INTERRUPTED, verbose)
    except QueueUnavailableError as exc:  # an outage, even when its class derives from ConfigurationError too
        return _fail(frontend, str(exc), EXIT_FAILURE, verbose)
    except (UsageError, ConfigurationError, UnknownConnectionError, NoQueueConfiguredError) as exc:
        return _fail(frontend, str(exc), EXIT_USAGE, verbose)
    except (CommandError, RainierError) as exc:
        return _fail(frontend, str(exc), EXIT_FAILURE, verbose)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, unless -v
        return _fail(frontend, f"{_one_line(exc)} (-v shows the traceback)", EXIT_FAILURE, verbose)
    finally:
        manager = getattr(args, "booted", None)
        if manager is not None:
            try:
                manager.close()
            except Exception:  # noqa: BLE001 - the command's outcome is what to report
                log.debug("closing the connections failed", exc_info=True)
        if restore_logging is not None:
            restore_logging()


def _fail(frontend: Frontend, message: str, code: int, verbose: bool) -> int:
    if verbose:
        traceback.print_exc(file=sys.stderr)
    sys.stderr.write(f"{frontend.name}: error: {' '.join(message.split())}\n")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
