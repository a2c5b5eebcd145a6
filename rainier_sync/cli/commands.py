"""The commands: ``queue:work``, ``queue:failed``, ``queue:retry``, ``schedule:run`` and the rest
(``check`` lives in :mod:`~rainier_sync.cli.check`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .._text import escaped
from .app import EXIT_FAILURE, EXIT_OK, CommandError, Frontend, UsageError, selected
from .output import Progress, table, when

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..types import FailedJob
    from ..worker import WorkerStats

log = logging.getLogger("rainier_sync")


def cmd_work(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = boot_for_work(frontend, args)
    if manager is None:
        log.info("worker stopped before its backend could be reached")
        return EXIT_OK
    stats = run_worker(frontend, manager, args)
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


class _Stopped(BaseException):
    """SIGTERM or SIGINT while the worker's manager could not be booted yet (a
    BaseException, so that no ``except Exception`` on the way takes it for an error)."""


def boot_for_work(frontend: Frontend, args: argparse.Namespace) -> QueueManager | None:
    """The worker's manager, booted once its backend can be reached; None when
    SIGTERM or SIGINT came first.

    A driver that connects as it is built (the database driver) cannot be built
    while its server is down. That is waited for as the worker waits for a
    backend at start-up: reported, tried again with a backoff, and a ``--once``
    run gives up after ``--give-up`` seconds; a refused configuration fails at once.
    """
    from ..worker.health import Health, is_outage
    from ..worker.options import ONCE_GIVE_UP

    give_up = ONCE_GIVE_UP if args.give_up is None else args.give_up
    health = Health(frontend, args.connection, once=args.once, give_up=give_up)
    previous: dict[int, Any] = {}

    def stop(signum: int, frame: Any) -> None:
        raise _Stopped

    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                return frontend.manager(args)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                health.failed("boot", exc)
            time.sleep(health.backoff())
    except _Stopped:
        return None
    finally:
        for signum, handler in previous.items():  # the worker installs its own
            signal.signal(signum, handler)


def run_worker(frontend: Frontend, manager: QueueManager, args: argparse.Namespace) -> WorkerStats:
    """The body of ``queue:work`` once a manager is at hand: checks, options, signals, run."""
    from ..errors import ConfigurationError
    from ..worker import WorkerOptions

    if args.quiet:
        log.setLevel(logging.WARNING)
    if args.fail_on_failed and not (args.once or args.max_jobs):
        raise UsageError(
            "--fail-on-failed needs --once or --max-jobs: a worker that runs until stopped has no run to judge "
            f"(see {frontend.command('queue:work')} --help)"
        )
    driver = manager.connection(args.connection)
    name = args.connection or manager.default
    if not driver.promises.needs_a_worker:
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
        "grace": args.grace,
        "schedule": args.schedule or None,
        "health_file": args.health_file,
        "relay": args.relay or None,
    }
    try:
        options = WorkerOptions(**{key: value for key, value in given.items() if value is not None})
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc
    worker = frontend.worker(manager, options, args.connection)
    if threading.current_thread() is threading.main_thread():
        worker.install_signal_handlers()
    log.info(
        "worker started: connection %s (%s), queues %s, concurrency %d%s",
        name,
        driver.kind,
        ",".join(options.queues),
        options.concurrency,
        (", once" if options.once else "")
        + (", scheduling" if options.schedule else "")
        + (", relaying the outbox" if options.relay else ""),
    )
    return worker.run()


def cmd_health(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    """A liveness probe: exit 0 while a worker's ``--health-file`` is fresh, 1 when it is old or missing."""
    path, most = args.health_file, args.max_age
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        out.write(f"unhealthy: health file {path} does not exist (no worker has touched it)\n")
        return EXIT_FAILURE
    except OSError as exc:
        raise CommandError(f"cannot read the health file {path}: {exc}") from exc
    age = max(0.0, age)
    if age > most:
        out.write(f"unhealthy: health file {path} was last touched {age:.1f}s ago, more than --max-age {most:g}s\n")
        return EXIT_FAILURE
    out.write(f"healthy: health file {path} was last touched {age:.1f}s ago (--max-age {most:g}s)\n")
    return EXIT_OK


def cmd_failed(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    chosen = selected(manager, args.connection)
    if args.id is not None:
        for _, driver in chosen:
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
    for _, driver in chosen:
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
            when(failed.failed_at),
            f"{failed.attempts}/{failed.max_attempts}",
            " ".join(failed.error.split()),
        ]
        for failed in found
    ]
    table(out, ["ID", "CONNECTION", "QUEUE", "JOB", "FAILED AT (UTC)", "TRIES", "ERROR"], rows, squeeze=6)
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
        "failed_at": when(failed.failed_at),
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
        ("Failed at", f"{when(failed.failed_at)} UTC"),
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
    # A stored value's lines are shown as lines, each escaped (no control character reaches the terminal).
    for label, value in fields:
        first, *rest = value.splitlines() or [""]
        out.write(f"{label.ljust(width)}{escaped(first)}".rstrip() + "\n")
        for line in rest:
            out.write(f"{' ' * width}{escaped(line)}".rstrip() + "\n")
    out.write("\nPayload:\n")
    out.write(json.dumps(failed.payload, indent=2) + "\n")
    out.write("\nTraceback:\n")
    for line in info.traceback.splitlines() or ["(none recorded)"]:
        out.write(escaped(line) + "\n")


def cmd_retry(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from ..errors import UniqueLockHeldError

    manager = frontend.manager(args)
    chosen = selected(manager, args.connection)
    if args.id != "all":
        for name, _ in chosen:
            if manager.retry_failed(args.id, connection=name):
                out.write(f"Queued failed job {args.id} again on connection {name}.\n")
                return EXIT_OK
        raise _no_failed_job(frontend, args.id)
    # Ids first, so a job that is retried and fails again meanwhile is not retried twice.
    pending: list[tuple[str, str]] = []
    for name, driver in chosen:
        pending.extend((name, failed.id) for failed in driver.failed_jobs(limit=max(driver.failed_count(), 1)))
    progress = Progress("Retrying", len(pending))
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
    for name, driver in selected(manager, args.connection):
        if driver.forget_failed(args.id):
            out.write(f"Forgot failed job {args.id} on connection {name}.\n")
            return EXIT_OK
    raise _no_failed_job(frontend, args.id)


def cmd_reclaim(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    for name, driver in selected(manager, args.connection):
        out.write(f"{name} ({driver.kind}): {driver.reclaim_expired()} lapsed reservation(s) reclaimed\n")
    return EXIT_OK


def cmd_status(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from ..outbox.dispatch import relayable
    from .outbox import outbox_state, print_outbox

    manager = frontend.manager(args)
    outbox = outbox_state(manager)
    wanted = [q for q in (args.queue or "").split(",") if q]
    report: list[dict[str, Any]] = []
    inline: dict[str, bool] = {}
    for name, driver in selected(manager, args.connection):
        entry: dict[str, Any] = {"connection": name, "driver": driver.kind, "queues": {}, "failed": 0, "workers": []}
        inline[name] = not driver.promises.deferred
        if driver.promises.deferred:
            if manager.locks is not None:  # else no worker records itself anywhere (said below)
                entry["workers"] = [worker.to_dict() for worker in manager.workers(name)]
            paused = manager.paused(name)
            for queue in dict.fromkeys([*wanted, *sorted(driver.queue_names()), *sorted(paused)]):
                counts = driver.counts(queue)
                entry["queues"][queue] = {
                    "ready": counts.ready,
                    "delayed": counts.delayed,
                    "reserved": counts.reserved,
                    "total": counts.total,
                    "paused": queue in paused,
                }
        entry["failed"] = driver.failed_count()
        if outbox is not None and manager.outbox is not None and manager.outbox.covers(name) and relayable(driver):
            entry["outbox"] = {"waiting": outbox["waiting"].get(name, 0), "refused": outbox["refused_by"].get(name, 0)}
        report.append(entry)
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
        return EXIT_OK
    rows: list[list[str]] = []
    for entry in report:
        if inline[entry["connection"]]:
            failed = str(entry["failed"])
            rows.append([entry["connection"], entry["driver"], "(runs jobs inline)", "", "", "", "", failed])
            continue
        if not entry["queues"]:
            rows.append([entry["connection"], entry["driver"], "(no jobs)", "0", "0", "0", "0", str(entry["failed"])])
        for index, (queue, c) in enumerate(entry["queues"].items()):
            failed = str(entry["failed"]) if index == 0 else ""
            sizes = [str(c["ready"]), str(c["delayed"]), str(c["reserved"]), str(c["total"])]
            label = f"{queue} (paused)" if c["paused"] else queue
            rows.append([entry["connection"], entry["driver"], label, *sizes, failed])
    headers = ["CONNECTION", "DRIVER", "QUEUE", "READY", "DELAYED", "RESERVED", "TOTAL", "FAILED"]
    table(out, headers, rows, numeric=range(3, 8))
    if outbox is not None:
        print_outbox(out, frontend, outbox)
    if manager.locks is not None:
        _print_workers(out, [worker for entry in report for worker in entry["workers"]])
    elif not all(inline.values()):
        out.write("\nWorkers: not recorded, the manager has no lock store (give QueueManager locks=).\n")
    return EXIT_OK


def _print_workers(out: IO[str], workers: list[dict[str, Any]]) -> None:
    """The workers recorded in the lock store, below the queues."""
    out.write("\n")
    if not workers:
        out.write("Workers: none recorded in the lock store.\n")
        return
    now = time.time()
    rows = [
        [
            w["id"],
            w["connection"],
            ",".join(w["queues"]),
            str(w["concurrency"]),
            str(w["running_count"]),
            when(w["started"]),
            f"{max(0.0, now - w['last_heartbeat']):.0f}s ago",
            w["version"],
        ]
        for w in workers
    ]
    headers = ["WORKER", "CONNECTION", "QUEUES", "THREADS", "RUNNING", "STARTED (UTC)", "SEEN", "VERSION"]
    table(out, headers, rows, numeric=(3, 4))


def cmd_pause(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    manager.pause(args.queue, connection=args.connection)
    where = args.connection or manager.default
    out.write(f"Paused queue {args.queue} on connection {where}: its workers stop claiming from it.\n")
    return EXIT_OK


def cmd_continue(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)
    manager.resume(args.queue, connection=args.connection)
    where = args.connection or manager.default
    out.write(f"Queue {args.queue} on connection {where} is worked again.\n")
    return EXIT_OK


def cmd_schedule_run(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from ..scheduler import Scheduler

    manager = frontend.manager(args)
    scheduler = Scheduler(manager, args.connection)
    scheduler.run_due()
    for name, tick, job_id in scheduler.dispatched:
        out.write(f"dispatched {name} (tick {when(tick)}) as job {job_id}\n")
    out.write(f"{len(scheduler.dispatched)} tick(s) dispatched; {len(scheduler.entries)} entries in the schedule\n")
    return EXIT_OK


def cmd_schedule_list(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from .. import _clock
    from ..scheduler import Scheduler

    manager = frontend.manager(args)
    scheduler = Scheduler(manager)
    now = _clock.now()
    rows: list[list[str]] = []
    for entry in scheduler.entries:
        latest = entry.latest(now)
        following = entry.following(now if latest is None else latest)
        local = datetime.fromtimestamp(following, tz=entry.zone).strftime("%Y-%m-%d %H:%M:%S %Z")
        held = scheduler.holder(entry, now)
        last = f"{when(held[0])} ({held[1]})" if held is not None else "-"
        rows.append([entry.name, entry.describe(), when(following), local, last])
    table(out, ["ENTRY", "WHEN", "NEXT (UTC)", "NEXT (ITS ZONE)", "LAST DISPATCHED"], rows)
    return EXIT_OK


def cmd_migrate(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    manager = frontend.manager(args)

    def applied(versions: list[int]) -> str:
        return f"applied migration(s) {', '.join(map(str, versions))}" if versions else "already up to date"

    for name, driver in selected(manager, args.connection):
        if not driver.capabilities.migrations:
            out.write(f"{name} ({driver.kind}): nothing to migrate\n")
            continue
        out.write(f"{name} ({driver.kind}): {applied(driver.migrate())}\n")
    if manager.outbox is not None and args.connection is None:
        out.write(f"outbox ({manager.outbox.target.where}): {applied(manager.outbox.migrate())}\n")
    return EXIT_OK


def cmd_make_job(frontend: Frontend, args: argparse.Namespace, out: IO[str]) -> int:
    from ..templates import render_job, render_test, scaffold

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


