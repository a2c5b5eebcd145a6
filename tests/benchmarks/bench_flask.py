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
- ``pages`` (``--pages memory,postgres,redis``; none by default): every page
  of the dashboard with ``--fleet-queued`` jobs queued (100,000), 50 workers
  recorded in the lock store (the backend's own: a memory, database or Redis
  lock store), each running 8 of them, and 60 minutes of fleet counts and
  wait times: the queues, the Workers page, a queue's ready jobs (first page,
  a page 100 deep, filtered by name), its reserved jobs (each matched to its
  worker), a reserved job's page, the page of a job no longer stored (a
  404 after looking everywhere), a failed job's page with a 10 MB error, and
  that error whole as plain text; median and worst of ``--renders``, and
  each page's size.

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


FLEET_WORKERS = 50
RUNNING_EACH = 8


def fleet_backend(label: str, workdir: str) -> tuple[Any, Any, Callable[[], None]]:
    """A driver and a lock store on ``label``'s backend, and what cleans them up."""
    import uuid

    from rainier_sync.locks import MemoryLockStore

    if label == "memory":
        return MemoryQueue(reservation=300), MemoryLockStore(), lambda: None
    if label == "redis":
        from rainier_sync.drivers.redis import RedisQueue
        from rainier_sync.locks import RedisLockStore

        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
        prefix = f"bench:{uuid.uuid4().hex[:10]}:"
        queue = RedisQueue.from_url(url, prefix=prefix, reservation=300)

        def drop_keys() -> None:
            keys = list(queue.client.scan_iter(match=prefix + "*", count=1000))
            for start in range(0, len(keys), 1000):
                queue.client.delete(*keys[start : start + 1000])

        return queue, RedisLockStore.from_url(url, prefix=prefix + "lock:"), drop_keys
    if label == "postgres":
        import urllib.parse

        import psycopg

        from rainier_sync.locks import DatabaseLockStore

        base = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
        schema = f"rainier_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        parts = urllib.parse.urlsplit(base)
        query = urllib.parse.urlencode({"options": f"-c search_path={schema}"}, quote_via=urllib.parse.quote)
        url = urllib.parse.urlunsplit(parts._replace(query=query))
        queue = DatabaseQueue.from_url(url, reservation=300)
        queue.migrate()
        locks = DatabaseLockStore.from_url(url)
        locks.migrate()

        def drop_schema() -> None:
            locks.close()
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        return queue, locks, drop_schema
    raise SystemExit(f"--pages: no backend {label!r} (memory, postgres, redis)")


def record_fleet(manager: QueueManager) -> str:
    """50 workers, each running 8 reserved jobs, and 60 minutes of counts; a reserved job's id."""
    import json

    from rainier_sync import _clock
    from rainier_sync.fleet import (
        RECORD_TTL,
        THROUGHPUT_KEEP,
        WAIT_BUCKETS,
        RunningJob,
        WorkerInfo,
        throughput_key,
        worker_key,
        workers_group,
    )

    locks = manager.locks
    assert locks is not None
    driver = manager.connection()
    reserved = driver.reserve_many(["default"], FLEET_WORKERS * RUNNING_EACH)
    now = _clock.now()
    for index in range(FLEET_WORKERS):
        mine = reserved[index * RUNNING_EACH : (index + 1) * RUNNING_EACH]
        info = WorkerInfo(
            id=f"bench-{index}",
            host=f"host-{index % 10}",
            pid=1000 + index,
            connection="main",
            queues=("default", "mail"),
            concurrency=RUNNING_EACH,
            version="bench",
            started=now - 3600,
            last_heartbeat=now,
            running=tuple(RunningJob(job.id, job.name, job.queue, now - 5) for job in mine),
            running_count=len(mine),
        )
        locks.put_value(worker_key(info.id), json.dumps(info.to_dict()), RECORD_TTL * 100)
        locks.set_flag(workers_group("main"), info.id, True)
    minute = int(now // 60) * 60
    for back in range(60):
        fields: dict[str, int] = {}
        for queue in ("default", "mail", "reports"):
            fields.update({f"{queue}|processed": 900 + back, f"{queue}|failed": back % 4, f"{queue}|released": 3})
            fields.update({f"{queue}|wait<={bound:g}": 50 + n for n, bound in enumerate(WAIT_BUCKETS[:8])})
        locks.tally_add(throughput_key("main", minute - 60 * back), fields, THROUGHPUT_KEEP)
    return str(reserved[0].id)


def fail_at_length(manager: QueueManager, size: int) -> str:
    """A failed job whose error (and traceback) is ``size`` bytes of lines holding markup; its id."""
    manager.dispatch(Broken(-1))
    driver = manager.connection()
    (job,) = driver.reserve_many(["mail"], 1)
    line = "<b>escaped</b> & a line of a long failure\n"
    try:
        raise RuntimeError(line * (size // len(line) + 1))
    except RuntimeError as exc:
        driver.fail(job, exc)
    return job.id


def bench_pages(label: str, queued: int, renders: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        driver, locks, cleanup = fleet_backend(label, workdir)
        try:
            app = Flask("bench")
            app.config["SECRET_KEY"] = secrets.token_hex(32)
            manager = QueueManager({"main": driver}, registry=registry(), container=Container(), locks=locks)
            RainierSync(app, manager=manager, authorize=lambda: True)
            filled = time.perf_counter()
            for start in range(0, queued, 5000):
                manager.dispatch_many(Noop(i) for i in range(start, min(queued, start + 5000)))
            job_id = record_fleet(manager)
            counts = driver.counts("default")
            assert counts.ready + counts.reserved == queued, counts
            took = time.perf_counter() - filled
            print(f"pages   {label:8} {queued:,} queued, {FLEET_WORKERS} workers (filled in {took:.0f} s)")
            client = app.test_client()
            pages = {
                "queues": "/queues/",
                "workers": "/queues/workers",
                "ready, page 1": "/queues/main/queues/default?state=ready",
                "ready, page 100": "/queues/main/queues/default?state=ready&page=100",
                "ready, filtered": "/queues/main/queues/default?state=ready&name=noop",
                "reserved": "/queues/main/queues/default?state=reserved",
                "a reserved job": f"/queues/main/jobs/{job_id}",
                "a finished job": "/queues/main/jobs/0123456789abcdef0123456789abcdef",
                "a 10 MB error": "",
                "its whole text": "",
            }
            for name, path in pages.items():
                if name == "a 10 MB error":
                    # Last: every listing of the failed jobs (the queues page's) would read it.
                    failed_id = fail_at_length(manager, 10 * 2**20)
                    path = f"/queues/main/failed/{failed_id}"
                elif name == "its whole text":
                    path = f"/queues/main/failed/{failed_id}/error"
                response = client.get(path)
                assert response.status_code == (404 if name == "a finished job" else 200), (path, response.status_code)
                times = []
                for _ in range(renders):
                    started = time.perf_counter()
                    client.get(path)
                    times.append((time.perf_counter() - started) * 1000)
                print(
                    f"  {name:16} median {statistics.median(times):7.1f} ms, worst {max(times):7.1f} ms, "
                    f"{len(response.data) / 1024:9,.0f} KiB"
                )
            manager.close()
        finally:
            cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--failed", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pages", default="", help="backends to render every page on: memory,postgres,redis")
    parser.add_argument("--fleet-queued", type=int, default=100_000)
    parser.add_argument("--only-pages", action="store_true", help="skip the worker and dashboard figures")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    for label in filter(None, args.pages.split(",")):
        bench_pages(label, args.fleet_queued, args.renders)
    if args.only_pages:
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    bench_worker(args.jobs, args.threads, args.repeat)
    bench_dashboard("memory", MemoryQueue(), args.renders, args.queued, args.failed, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = DatabaseQueue.from_url(f"sqlite:///{tmp}/bench.sqlite3")
        sqlite.migrate()
        bench_dashboard("sqlite", sqlite, args.renders, args.queued, args.failed, args.repeat)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
