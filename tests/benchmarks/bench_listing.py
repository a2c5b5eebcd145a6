"""Listing benchmark: what a browse page of the dashboard costs the driver, with a big queue.

    .venv/bin/python tests/benchmarks/bench_listing.py [--targets postgres,sqlite,mysql,redis]
        [--jobs 100000] [--delayed 1000] [--reserved 200] [--repeat 21]

Each target gets ``--jobs`` ready jobs on one queue (nine names in turn, one
in ten at priority 5, one job named ``app.jobs.RareReport`` last), ``--delayed``
delayed ones and ``--reserved`` reserved ones, then times (median of
``--repeat`` calls, after one unmeasured call; milliseconds):

- ``first page``: ``list_jobs(queue, "ready")``, 50 jobs;
- ``offset 5,000``: the page of 50 at offset 5,000;
- ``filter hit``: ``name="ResizeImage"`` (one job in nine matches);
- ``filter rare``: ``name="RareReport"`` (only the last job matches);
- ``filter miss``: ``name="NoSuchJob"``;
- ``delayed``, ``reserved``: the first page of each;
- ``find head``, ``find last``, ``find unknown``: ``find_job`` of the first
  ready job, of the last one pushed, and of an id that is nowhere.

PostgreSQL (``TEST_POSTGRES_URL``) in a schema of its own, SQLite on a fresh
file, MariaDB (``TEST_MYSQL_URL``) in a database of its own, Redis
(``REDIS_URL``) under a fresh prefix; each removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import urllib.parse
import uuid
from typing import Any, Callable

from rainier_sync import _clock
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.drivers.paging import Page
from rainier_sync.types import QueuedJob

NAMES = [
    f"app.jobs.{name}"
    for name in (
        "SendEmail",
        "ResizeImage",
        "ChargeCard",
        "SyncInventory",
        "BuildReport",
        "IndexDocument",
        "NotifySlack",
        "ExportCsv",
        "WarmCache",
    )
]


def make_target(name: str, workdir: str) -> tuple[BaseQueue, Callable[[], None]]:
    """A fresh, empty driver of ``name`` and what removes its store."""
    if name == "redis":
        from rainier_sync.drivers.redis import RedisQueue

        prefix = f"benchlist:{uuid.uuid4().hex[:10]}:"
        redis_queue = RedisQueue.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"), prefix=prefix)

        def drop_keys() -> None:
            keys = list(redis_queue.client.scan_iter(match=prefix + "*", count=1000))
            for start in range(0, len(keys), 1000):
                redis_queue.client.delete(*keys[start : start + 1000])
            redis_queue.close()

        return redis_queue, drop_keys
    from rainier_sync.drivers.database import DatabaseQueue

    if name == "sqlite":
        queue = DatabaseQueue.from_url(f"sqlite:///{os.path.join(workdir, 'listing.db')}")
        queue.migrate()
        return queue, queue.close
    tag = f"rainier_bench_{uuid.uuid4().hex[:8]}"
    if name == "postgres":
        import psycopg

        base = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{tag}"')
        parts = urllib.parse.urlsplit(base)
        query = urllib.parse.urlencode({"options": f"-c search_path={tag}"}, quote_via=urllib.parse.quote)
        queue = DatabaseQueue.from_url(urllib.parse.urlunsplit(parts._replace(query=query)))
        queue.migrate()

        def drop_schema() -> None:
            queue.close()
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')

        return queue, drop_schema
    import pymysql

    base = os.environ.get("TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
    parts = urllib.parse.urlsplit(base)

    def server() -> Any:
        return pymysql.connect(host=parts.hostname, port=parts.port or 3306, user=parts.username or "root")

    conn = server()
    with conn.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE `{tag}`")
    conn.close()
    queue = DatabaseQueue.from_url(urllib.parse.urlunsplit(parts._replace(path=f"/{tag}")))
    queue.migrate()

    def drop_database() -> None:
        queue.close()
        conn = server()
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{tag}`")
        conn.close()

    return queue, drop_database


def fill(queue: BaseQueue, jobs: int, delayed: int, reserved: int) -> tuple[str, str]:
    """The jobs of the benchmark; returns the ids of the first ready job and the last one pushed."""
    now = _clock.now()

    def made(n: int, name: str, delay: float = 0.0) -> QueuedJob:
        return QueuedJob(
            id=uuid.uuid4().hex,
            name=name,
            queue="default",
            payload={"user_id": n, "email": f"user{n}@example.com", "template": "welcome"},
            max_attempts=3,
            priority=5 if n % 10 == 9 else 0,
            available_at=now + delay,
            dispatched_at=now,
        )

    # the reserved ones first, so that the ready jobs left start with the first pushed after them
    queue.push_many([made(n, NAMES[n % len(NAMES)]) for n in range(reserved)])
    taken = 0
    while taken < reserved:
        got = queue.reserve_many(["default"], reserved - taken)
        if not got:
            break
        taken += len(got)
    first = ""
    last = ""
    for start in range(0, jobs, 1000):
        batch = [made(n, NAMES[n % len(NAMES)]) for n in range(start, min(jobs, start + 1000))]
        if start + 1000 >= jobs:
            batch[-1].name = "app.jobs.RareReport"
            last = batch[-1].id
        queue.push_many(batch)
        first = first or batch[0].id
    queue.push_many([made(n, NAMES[n % len(NAMES)], delay=3600 + n) for n in range(delayed)])
    return first, last


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    result = call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000, result


def bench(name: str, args: argparse.Namespace, workdir: str) -> dict[str, str]:
    queue, cleanup = make_target(name, workdir)
    try:
        started = time.perf_counter()
        first, last = fill(queue, args.jobs, args.delayed, args.reserved)
        counts = queue.counts("default")
        if name == "postgres":
            queue._backend.execute("ANALYZE rainier_jobs")  # type: ignore[attr-defined]
        print(f"{name}: filled in {time.perf_counter() - started:.1f}s: {counts}", flush=True)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        row = {"target": name, "load": load}
        cases: dict[str, Callable[[], Any]] = {
            "first page": lambda: queue.list_jobs("default", "ready"),
            "offset 5,000": lambda: queue.list_jobs("default", "ready", offset=5000),
            "filter hit": lambda: queue.list_jobs("default", "ready", name="ResizeImage"),
            "filter rare": lambda: queue.list_jobs("default", "ready", name="RareReport"),
            "filter miss": lambda: queue.list_jobs("default", "ready", name="NoSuchJob"),
            "delayed": lambda: queue.list_jobs("default", "delayed"),
            "reserved": lambda: queue.list_jobs("default", "reserved"),
            "find head": lambda: queue.find_job(first),
            "find last": lambda: queue.find_job(last),
            "find unknown": lambda: queue.find_job("no-such-job"),
        }
        for case, call in cases.items():
            ms, result = timed(call, args.repeat)
            note = ""
            if isinstance(result, Page) and not result.complete:
                note = f" ({len(result)}, stopped at {result.bound:,})"
            elif isinstance(result, list):
                note = f" ({len(result)})"
            elif result is None:
                note = " (none)"
            row[case] = f"{ms:.2f}{note}"
        return row
    finally:
        cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="postgres,sqlite,mysql,redis")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--delayed", type=int, default=1_000)
    parser.add_argument("--reserved", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; {args.jobs:,} ready, {args.delayed:,} delayed, {args.reserved:,} reserved")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.targets.split(","):
            rows.append(bench(name, args, workdir))
    heads = list(rows[0])
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---" for _ in heads) + "|")
    for row in rows:
        print("| " + " | ".join(row[h] for h in heads) + " |")


if __name__ == "__main__":
    main()
