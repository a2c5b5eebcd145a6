"""Job middleware benchmark: what ``RateLimited`` costs a drain.

    .venv/bin/python tests/benchmarks/bench_middleware.py [--jobs 5000] [--threads 8] [--repeat 3]

One worker (this process, ``--threads`` threads, ``once``) drains ``--jobs``
no-op jobs on Redis (``REDIS_URL``, default ``redis://127.0.0.1:6379/13``) and
on PostgreSQL (``POSTGRES_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``),
the lock store on the same server: jobs without middleware, then the same
jobs under ``RateLimited`` with a limit far above the load (every check says
yes). Figures: jobs per second (best of ``--repeat``) and the cost per job of
the limiter. A backend that cannot be reached is skipped.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions  # noqa: E402
from rainier_sync.middleware import RateLimited  # noqa: E402


@dataclass
class Plain(Job):
    NAME = "bench.mw.plain"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Limited(Plain):
    NAME = "bench.mw.limited"

    def middleware(self) -> list[Any]:
        return [RateLimited("bench", limit=10_000_000, per=1)]


def backends() -> list[tuple[str, Any, Any, Any]]:
    found: list[tuple[str, Any, Any, Any]] = []
    try:
        from rainier_sync.drivers.redis import RedisQueue
        from rainier_sync.locks import RedisLockStore

        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
        prefix = f"bench-mw:{uuid.uuid4().hex[:8]}:"
        driver = RedisQueue.from_url(url, prefix=prefix)
        driver.size("default")
        found.append(("redis", driver, RedisLockStore.from_url(url, prefix=prefix + "lock:"), None))
    except Exception as exc:  # noqa: BLE001 - a benchmark skips what it cannot reach
        print(f"redis skipped: {exc}")
    try:
        from rainier_sync.drivers.database import DatabaseQueue

        url = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
        driver = DatabaseQueue.from_url(url)
        driver.migrate()
        found.append(("postgres", driver, driver.lock_store(), None))
    except Exception as exc:  # noqa: BLE001
        print(f"postgres skipped: {exc}")
    return found


def drain(driver: Any, locks: Any, cls: type[Plain], jobs: int, threads: int) -> float:
    registry = JobRegistry().with_job(cls)
    manager = QueueManager({"b": driver}, registry=registry, container=Container(), locks=locks)
    manager.dispatch_many([cls(n) for n in range(jobs)])
    started = time.perf_counter()
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=threads)).run()
    took = time.perf_counter() - started
    assert stats.processed == jobs, stats
    return jobs / took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f}; {args.jobs} jobs, {args.threads} threads")
    for name, driver, locks, _ in backends():
        plain = max(drain(driver, locks, Plain, args.jobs, args.threads) for _ in range(args.repeat))
        limited = max(drain(driver, locks, Limited, args.jobs, args.threads) for _ in range(args.repeat))
        cost = (1 / limited - 1 / plain) * 1e6
        print(f"{name:9s} no middleware {plain:8.0f} jobs/s   RateLimited {limited:8.0f} jobs/s   +{cost:.0f} us/job")
        driver.close()


if __name__ == "__main__":
    main()
