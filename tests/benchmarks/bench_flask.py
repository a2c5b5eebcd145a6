"""Flask integration benchmark: the cost of an app context per job, and of a dashboard page.

    .venv/bin/python tests/benchmarks/bench_flask.py [--jobs 20000] [--threads 4] [--renders 20]
        [--queued 10000] [--failed 1000] [--repeat 3]

- ``worker``: a plain :class:`~rainier_sync.Worker` and a
  :class:`~rainier_sync.flask.FlaskWorker` (a fresh ``app.app_context()`` per
  job) each run ``--jobs`` no-op jobs from a full memory queue to empty
  (``once`` mode, ``--threads`` threads); jobs/s and the overhead per job.
- ``dashboard``: ``GET /queues/`` through the test client, ``--renders``
  times, with ``--queued`` jobs queued and ``--failed`` failed on the memory
  driver and on SQLite (WAL, a fresh file): median and worst milliseconds.

Each figure is the best of ``--repeat`` runs (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from flask import Flask

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.flask import FlaskWorker, RainierSync


@dataclass
class Noop(Job):
    NAME = "bench.flask.noop"

    n: int

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Broken(Job):
    NAME = "bench.flask.broken"
    QUEUE = "mail"

    n: int

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(f"broken {self.n}")


def registry() -> JobRegistry:
    return JobRegistry().with_job(Noop).with_job(Broken)


def app_with(driver: Any) -> tuple[Flask, QueueManager]:
    app = Flask("bench")
    app.config["SECRET_KEY"] = secrets.token_hex(32)
    manager = QueueManager(connections={"main": driver}, registry=registry(), container=Container())
    RainierSync(app, manager=manager, authorize=lambda: True)
    return app, manager


def drain(jobs: int, threads: int, make: Callable[[Flask, QueueManager], Worker]) -> float:
    app, manager = app_with(MemoryQueue())
    manager.dispatch_many(Noop(i) for i in range(jobs))
    worker = make(app, manager)
    started = time.perf_counter()
    stats = worker.run()
    elapsed = time.perf_counter() - started
    assert stats.processed == jobs, stats
    return jobs / elapsed


def bench_worker(jobs: int, threads: int, repeat: int) -> None:
    options = WorkerOptions(once=True, concurrency=threads)
    plain = max(drain(jobs, threads, lambda app, m: Worker(m, options=options)) for _ in range(repeat))
    flask = max(drain(jobs, threads, lambda app, m: FlaskWorker(app, m, options=options)) for _ in range(repeat))
    overhead_us = (1 / flask - 1 / plain) * 1e6
    print(f"worker  memory  {jobs} no-op jobs, {threads} threads (best of {repeat})")
    print(f"  Worker        {plain:10,.0f} jobs/s")
    print(f"  FlaskWorker   {flask:10,.0f} jobs/s   app context per job: {overhead_us:+.1f} us/job")


def fill(manager: QueueManager, queued: int, failed: int) -> None:
    manager.dispatch_many(Broken(i) for i in range(failed))
    driver = manager.connection()
    for job in driver.reserve_many(["mail"], failed):
        driver.fail(job, RuntimeError(f"broken {job.payload['n']} <b>escaped</b>"))
    for start in range(0, queued, 1000):
        manager.dispatch_many(Noop(i) for i in range(start, min(queued, start + 1000)))


def bench_dashboard(label: str, driver: Any, renders: int, queued: int, failed: int, repeat: int) -> None:
    app, manager = app_with(driver)
    fill(manager, queued, failed)
    client = app.test_client()
    assert client.get("/queues/").status_code == 200
    best: list[float] = []
    for _ in range(repeat):
        times = []
        for _ in range(renders):
            started = time.perf_counter()
            response = client.get("/queues/")
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        if not best or statistics.median(times) < statistics.median(best):
            best = times
    print(
        f"dashboard {label:7} {queued} queued, {failed} failed: "
        f"median {statistics.median(best):7.1f} ms, worst {max(best):7.1f} ms ({renders} renders, best of {repeat})"
    )
    manager.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--failed", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    bench_worker(args.jobs, args.threads, args.repeat)
    bench_dashboard("memory", MemoryQueue(), args.renders, args.queued, args.failed, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = DatabaseQueue.from_url(f"sqlite:///{tmp}/bench.sqlite3")
        sqlite.migrate()
        bench_dashboard("sqlite", sqlite, args.renders, args.queued, args.failed, args.repeat)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
