"""Jobs and a worker process for the database driver's reliability tests.

``python -m tests.drivers.database.jobs URL OUT_DIR [options]`` runs a
:class:`~rainier_sync.Worker` over ``URL``; every job it runs appends a line
to ``OUT_DIR/<pid>.runs``, so the test can count how often each job ran.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import threading
import time
from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.database import DatabaseQueue

OUT_DIR = pathlib.Path(os.environ.get("RAINIER_TEST_OUT", "/tmp"))
_lock = threading.Lock()
_handle: dict[str, int] = {}


def record(line: str) -> None:
    """Append one line to this process's run log (one write, O_APPEND)."""
    with _lock:
        fd = _handle.get("fd")
        if fd is None:
            fd = os.open(OUT_DIR / f"{os.getpid()}.runs", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _handle["fd"] = fd
        os.write(fd, f"{line}\n".encode())


@dataclass
class Count(Job):
    """Records that it ran; ``pause`` seconds of work first."""

    NAME = "dbtest.count"
    TRIES = 3

    n: int
    pause: float = 0.0

    def handle(self, context: JobContext) -> None:
        if self.pause:
            time.sleep(self.pause)
        record(f"{self.n} {context.attempt}")


@dataclass
class Ledger(Job):
    """Records that it ran, with tries enough that a job held by several killed
    workers in turn still runs rather than failing as lost."""

    NAME = "dbtest.ledger"
    TRIES = 10

    n: int

    def handle(self, context: JobContext) -> None:
        record(f"{self.n} {context.attempt}")


@dataclass
class Stall(Job):
    """On its first attempt, announces itself and hangs (to be killed); later attempts finish."""

    NAME = "dbtest.stall"
    TRIES = 3

    n: int

    def handle(self, context: JobContext) -> None:
        if context.attempt == 1:
            (OUT_DIR / f"started-{self.n}").write_text(str(os.getpid()))
            time.sleep(60)
        record(f"{self.n} {context.attempt}")


REGISTRY = JobRegistry().with_job(Count).with_job(Ledger).with_job(Stall)


def manager(url: str, reservation: float = 90, **options: object) -> QueueManager:
    queue = DatabaseQueue.from_url(url, reservation=reservation, **options)  # type: ignore[arg-type]
    return QueueManager(connections={"db": queue}, registry=REGISTRY, container=Container())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--reservation", type=float, default=90)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--max-jobs", type=int, default=None)
    parser.add_argument("--reclaim-interval", type=float, default=60.0)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--application-name", default="rainier_sync")
    parser.add_argument("--prefetch", type=int, default=None)
    args = parser.parse_args()
    m = manager(args.url, args.reservation, application_name=args.application_name)
    options = WorkerOptions(
        queues=["default"],
        concurrency=args.concurrency,
        once=args.once,
        max_jobs=args.max_jobs,
        reclaim_interval=args.reclaim_interval,
        sleep=args.sleep,
        prefetch=args.prefetch,
    )
    worker = Worker(m, options=options)
    worker.install_signal_handlers()
    stats = worker.run()
    print(f"processed={stats.processed} failed={stats.failed} released={stats.released}", flush=True)
    m.close()


if __name__ == "__main__":
    main()
