"""Outbox benchmark: dispatch within a transaction, one relay's throughput to
Redis, and the relay's lag from commit to pushed.

    .venv/bin/python tests/benchmarks/bench_outbox.py [--jobs 20000] [--repeat 3] [--databases postgresql,sqlite,mysql]

Uses the PostgreSQL at ``POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``, a database of its own), the
MariaDB at ``MYSQL_URL`` (``mysql://root@127.0.0.1:3306/test``, a database of
its own), a SQLite file in a temporary directory, and the Redis at
``REDIS_URL`` (``redis://127.0.0.1:6379/13``) under a fresh prefix; all are
dropped afterwards. Every job is a no-op ``Note``.

- dispatch: ``manager.pending(job).within(conn).send()`` of ``--jobs`` jobs on
  the caller's raw connection, 100 per transaction, committed.
- relay: one :class:`~rainier_sync.outbox.Relay` (batches of 500) publishes
  that backlog to Redis with ``push_many`` and deletes it; ``run_once``, timed.
  Beside it, ``dispatch_many`` of as many jobs straight to Redis, for scale.
- dispatch + relay: a relay thread runs while a process of its own (a web
  process, say) dispatches ``--jobs`` jobs as above; from the start of that
  process to the last job pushed.
- lag (PostgreSQL): a relay thread waits on ``LISTEN``; one job per
  transaction, every 20 ms; from the caller's ``commit()`` returning to
  ``push_many`` returning with that job in it, 300 samples.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Job, JobContext, JobRegistry, QueueManager  # noqa: E402
from rainier_sync.drivers import RedisQueue  # noqa: E402
from rainier_sync.outbox import Outbox, Relay  # noqa: E402

POSTGRES_URL = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")


@dataclass
class Note(Job):
    NAME = "bench.outbox.note"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        pass


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


# -- the databases ---------------------------------------------------------------------------------


class Database:
    """A fresh database of one dialect with the outbox migrated, and callers' connections to it."""

    def __init__(self, dialect: str, tmp: str) -> None:
        self.dialect = dialect
        self._drop: Callable[[], None] = lambda: None
        if dialect == "sqlite":
            self.url = f"sqlite:///{tmp}/app.db"
        elif dialect == "postgresql":
            import psycopg

            # A database of its own: what other sessions of the server's other databases hold
            # back (an old snapshot) does not keep this one's dead rows from being cleared.
            name = f"bench_outbox_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            parts = urllib.parse.urlsplit(POSTGRES_URL)
            self.url = urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))

            def drop() -> None:
                with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

            self._drop = drop
        else:
            import pymysql

            name = f"bench_outbox_{uuid.uuid4().hex[:8]}"
            parts = urllib.parse.urlsplit(MYSQL_URL)
            server = {"host": parts.hostname, "port": parts.port or 3306, "user": parts.username or "root"}
            with closing(pymysql.connect(**server, autocommit=True)) as conn, conn.cursor() as cursor:  # type: ignore[arg-type]
                cursor.execute(f"CREATE DATABASE `{name}`")
            self.url = urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))

            def drop() -> None:
                with closing(pymysql.connect(**server, autocommit=True)) as conn, conn.cursor() as cursor:  # type: ignore[arg-type]
                    cursor.execute(f"DROP DATABASE `{name}`")

            self._drop = drop
        Outbox.from_url(self.url).migrate()

    def connect(self) -> Any:
        parts = urllib.parse.urlsplit(self.url)
        if self.dialect == "sqlite":
            return sqlite3.connect(parts.path[1:], timeout=30)
        if self.dialect == "postgresql":
            import psycopg

            return psycopg.connect(self.url)
        import pymysql

        return pymysql.connect(
            host=parts.hostname, port=parts.port or 3306, user=parts.username, database=parts.path[1:]
        )

    def drop(self) -> None:
        self._drop()


def manager_for(db: Database, prefix: str) -> tuple[QueueManager, RedisQueue]:
    driver = RedisQueue.from_url(REDIS_URL, prefix=prefix)
    manager = QueueManager({"fast": driver}, registry=JobRegistry().with_job(Note), outbox=Outbox.from_url(db.url))
    return manager, driver


def cleanup(driver: RedisQueue) -> None:
    keys = list(driver.client.scan_iter(match=driver.prefix + "*", count=1000))
    if keys:
        driver.client.delete(*keys)


def dispatch(manager: QueueManager, db: Database, jobs: int, per: int = 100) -> float:
    """Dispatch ``jobs`` within transactions of ``per``; seconds taken."""
    with closing(db.connect()) as conn:
        started = time.perf_counter()
        for start in range(0, jobs, per):
            for n in range(start, min(jobs, start + per)):
                manager.pending(Note(n)).within(conn).send()
            conn.commit()
        return time.perf_counter() - started


# -- the measurements ------------------------------------------------------------------------------


def bench_backlog(db: Database, jobs: int) -> dict[str, float]:
    manager, driver = manager_for(db, f"bench:outbox:{uuid.uuid4().hex[:8]}:")
    try:
        dispatched = dispatch(manager, db, jobs)
        relay = Relay(manager)
        started = time.perf_counter()
        relayed = relay.run_once()
        took = time.perf_counter() - started
        assert relayed == jobs and driver.size("default") == jobs, (relayed, driver.size("default"))
        cleanup(driver)
        direct = [manager.build(Note(n), connection="fast") for n in range(jobs)]
        started = time.perf_counter()
        driver.push_many(direct)
        straight = time.perf_counter() - started
        return {"dispatch": jobs / dispatched, "relay": jobs / took, "push_many": jobs / straight}
    finally:
        cleanup(driver)
        manager.close()


def _dispatch_in_child(db: Database, prefix: str, jobs: int) -> None:
    manager, _ = manager_for(db, prefix)
    dispatch(manager, db, jobs)
    manager.close()


def bench_together(db: Database, jobs: int) -> float:
    """Dispatching (in a process of its own, as a web process would) while one relay
    publishes: jobs per second, from the first dispatch to the last job pushed."""
    import multiprocessing

    prefix = f"bench:outbox:{uuid.uuid4().hex[:8]}:"
    manager, driver = manager_for(db, prefix)
    relay = Relay(manager, sleep=0.01)
    try:
        relay.start()
        time.sleep(0.2)
        child = multiprocessing.get_context("fork").Process(target=_dispatch_in_child, args=(db, prefix, jobs))
        started = time.perf_counter()
        child.start()
        deadline = time.monotonic() + 120
        while driver.size("default") < jobs and time.monotonic() < deadline:
            time.sleep(0.002)
        took = time.perf_counter() - started
        child.join(30)
        assert driver.size("default") == jobs
        return jobs / took
    finally:
        relay.stop()
        relay.join(10)
        cleanup(driver)
        manager.close()


def bench_lag(db: Database, samples: int = 300) -> list[float]:
    """Commit to pushed, in milliseconds."""
    manager, driver = manager_for(db, f"bench:outbox:{uuid.uuid4().hex[:8]}:")
    pushed: dict[str, float] = {}
    push_many, push = driver.push_many, driver.push

    def timed_many(jobs: Any) -> list[str]:
        ids = push_many(jobs)
        now = time.perf_counter()
        for job_id in ids:
            pushed[job_id] = now
        return ids

    def timed_one(job: Any) -> str:
        job_id = push(job)
        pushed[job_id] = time.perf_counter()
        return job_id

    driver.push_many = timed_many  # type: ignore[method-assign]
    driver.push = timed_one  # type: ignore[method-assign]
    relay = Relay(manager, sleep=5.0)
    committed: dict[str, float] = {}
    try:
        relay.start()
        time.sleep(0.3)  # listening
        with closing(db.connect()) as conn:
            for n in range(samples):
                job_id = manager.pending(Note(n)).within(conn).send()
                conn.commit()
                committed[str(job_id)] = time.perf_counter()
                time.sleep(0.02)
        deadline = time.monotonic() + 30
        while len(pushed) < samples and time.monotonic() < deadline:
            time.sleep(0.01)
        return [(pushed[job_id] - at) * 1000 for job_id, at in committed.items()]
    finally:
        relay.stop()
        relay.join(10)
        cleanup(driver)
        manager.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--databases", default="postgresql,sqlite,mysql")
    args = parser.parse_args()
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}")
    for dialect in args.databases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            db = Database(dialect, tmp)
            try:
                runs = [bench_backlog(db, args.jobs) for _ in range(args.repeat)]
                together = [bench_together(db, args.jobs) for _ in range(args.repeat)]
                best = {key: max(run[key] for run in runs) for key in runs[0]}
                print(f"\n{dialect}, {args.jobs:,} jobs, best of {args.repeat}:")
                print(f"  dispatch within, 100 per transaction  {best['dispatch']:>9,.0f} jobs/s")
                relays = ", ".join(f"{run['relay']:,.0f}" for run in runs)
                print(f"  relay to Redis, one relay            {best['relay']:>9,.0f} jobs/s (runs: {relays})")
                print(f"  push_many straight to Redis          {best['push_many']:>9,.0f} jobs/s")
                both = ", ".join(f"{rate:,.0f}" for rate in together)
                print(f"  dispatch + relay at once             {max(together):>9,.0f} jobs/s (runs: {both})")
                if dialect == "postgresql":
                    lags = bench_lag(db)
                    print(
                        f"  lag, commit to pushed (LISTEN)       p50 {percentile(lags, 50):.2f} ms, "
                        f"p99 {percentile(lags, 99):.2f} ms, mean {statistics.mean(lags):.2f} ms ({len(lags)} samples)"
                    )
            finally:
                db.drop()
    print(f"\nload average after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
