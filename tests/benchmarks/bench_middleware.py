"""Job middleware benchmark: what ``RateLimited`` costs a drain.

    .venv/bin/python tests/benchmarks/bench_middleware.py [--jobs 5000] [--threads 8] [--repeat 3]
        [--backends redis,postgres]

One worker (this process, ``--threads`` threads, ``once``) drains ``--jobs``
no-op jobs on Redis (``REDIS_URL``, default ``redis://127.0.0.1:6379/13``) and
on PostgreSQL (``POSTGRES_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``),
the lock store on the same server (on PostgreSQL the queue's own connection):
jobs without middleware, and the same jobs under ``RateLimited`` with a limit
far above the load (every check says yes), the two drains taking turns
``--repeat`` times so that a busy machine weighs on both alike. Figures: jobs
per second (best of the turns), the cost per job of the limiter, and how many
round trips to the lock store the limiter made. A backend that cannot be
reached is skipped.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

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

    #: A limiter of each run's own (the window of an earlier run, in a database, is left alone).
    limiter: ClassVar[str] = f"bench-{uuid.uuid4().hex[:8]}"

    def middleware(self) -> list[Any]:
        return [RateLimited(self.limiter, limit=10_000_000, per=1)]


def backends() -> list[tuple[str, Any, Any, Callable[[], None]]]:
    found: list[tuple[str, Any, Any, Callable[[], None]]] = []
    try:
        from rainier_sync.drivers.redis import RedisQueue
        from rainier_sync.locks import RedisLockStore

        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
        prefix = f"bench-mw:{uuid.uuid4().hex[:8]}:"
        driver = RedisQueue.from_url(url, prefix=prefix)
        driver.size("default")
        def forget(url: str = url, prefix: str = prefix) -> None:
            import redis

            client = redis.Redis.from_url(url)
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()

        found.append(("redis", driver, RedisLockStore.from_url(url, prefix=prefix + "lock:"), forget))
    except Exception as exc:  # noqa: BLE001 - a benchmark skips what it cannot reach
        print(f"redis skipped: {exc}")
    try:
        from rainier_sync.drivers.database import DatabaseQueue

        url = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
        driver = DatabaseQueue.from_url(url)
        driver.migrate()
        def drop(driver: Any = driver) -> None:
            driver._backend.execute("DELETE FROM rainier_windows WHERE window_key = %s", (f"rate:{Limited.limiter}",))

        found.append(("postgres", driver, driver.lock_store(), drop))
    except Exception as exc:  # noqa: BLE001
        print(f"postgres skipped: {exc}")
    return found


class Counting:
    """Counts the lock store's window round trips (``take_many``, or ``take`` before it)."""

    def __init__(self, locks: Any) -> None:
        self.trips = 0
        for name in ("take", "take_many"):
            method = getattr(locks, name, None)
            if method is not None:
                setattr(locks, name, self._counted(method))

    def _counted(self, method: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.trips += 1
            return method(*args, **kwargs)

        return counted


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
    parser.add_argument("--backends", default="redis,postgres")
    args = parser.parse_args()
    wanted = args.backends.split(",")
    print(f"{args.jobs} jobs, {args.threads} threads")
    for name, driver, locks, forget in backends():
        if name not in wanted:
            forget()
            driver.close()
            continue
        load = os.getloadavg()[0]
        counting = Counting(locks)
        plain: list[float] = []
        limited: list[float] = []
        for _ in range(args.repeat):
            plain.append(drain(driver, locks, Plain, args.jobs, args.threads))
            limited.append(drain(driver, locks, Limited, args.jobs, args.threads))
        best, best_limited = max(plain), max(limited)
        cost = (1 / best_limited - 1 / best) * 1e6
        per_trip = args.jobs * args.repeat / max(1, counting.trips)
        print(
            f"{name:9s} no middleware {best:8.0f} jobs/s   RateLimited {best_limited:8.0f} jobs/s   "
            f"+{cost:.0f} us/job   {per_trip:.0f} jobs per store round trip   (load {load:.2f})"
        )
        forget()
        driver.close()


if __name__ == "__main__":
    main()
