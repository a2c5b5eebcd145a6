"""Batch benchmark: what a batch's bookkeeping costs a dispatch and a drain.

    .venv/bin/python tests/benchmarks/bench_batch.py [--jobs 10000] [--threads 8] [--repeat 9]
        [--backends redis,postgres]

On Redis (``REDIS_URL``, default ``redis://127.0.0.1:6379/13``, keys under a
prefix of their own) and on PostgreSQL (``POSTGRES_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``, in a schema of its own, dropped
at the end), the lock store on the same server: ``--jobs`` no-op jobs are
dispatched (``dispatch_many``) and drained by one worker (this process,
``--threads`` threads, ``once``); then the same jobs in one batch
(``manager.batch(jobs).dispatch()``), the two alternating. Figures: jobs per
second over dispatch and drain together (best of ``--repeat``), each part's,
and the batch's share of the plain rate, paired run by run (a plain run and
the batch run next to it: their median and quartiles, the figure to quote on a
busy machine, where one run of either can be far off the next) and of the best
runs of each. A backend that cannot be reached is skipped.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions  # noqa: E402


@dataclass
class Noop(Job):
    NAME = "bench.batch.noop"
    QUEUE = "bench-batch"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        pass


@contextmanager
def redis() -> Iterator[tuple[Any, Any]]:
    import redis as client_module

    from rainier_sync.drivers.redis import RedisQueue
    from rainier_sync.locks import RedisLockStore

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
    prefix = f"bench-batch:{uuid.uuid4().hex[:8]}:"
    driver = RedisQueue.from_url(url, prefix=prefix)
    locks = RedisLockStore.from_url(url, prefix=prefix + "lock:")
    driver.size(Noop.QUEUE)
    try:
        yield driver, locks
    finally:
        driver.close()
        locks.close()
        client = client_module.Redis.from_url(url)
        for keys in _chunks(list(client.scan_iter(match=prefix + "*", count=1000))):
            client.delete(*keys)
        client.close()


@contextmanager
def postgres() -> Iterator[tuple[Any, Any]]:
    import psycopg

    from rainier_sync.drivers.database import DatabaseQueue
    from tests.drivers.database.support import with_search_path

    base = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"bench_batch_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        driver = DatabaseQueue.from_url(with_search_path(base, schema))
        driver.migrate()
        locks = driver.lock_store()
        locks.migrate()
        try:
            yield driver, locks
        finally:
            driver.close()
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _chunks(items: list[Any], size: int = 1000) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class Run:
    dispatch: float
    drain: float

    def rate(self, jobs: int) -> float:
        return jobs / (self.dispatch + self.drain)


def run(driver: Any, locks: Any, jobs: int, threads: int, batched: bool) -> Run:
    manager = QueueManager({"b": driver}, registry=JobRegistry().with_job(Noop), container=Container(), locks=locks)
    work = [Noop(n) for n in range(jobs)]
    started = time.perf_counter()
    batch_id = manager.batch(work, name="bench").dispatch().id if batched else None
    if not batched:
        manager.dispatch_many(work)
    dispatched = time.perf_counter()
    stats = Worker(manager, options=WorkerOptions(queues=[Noop.QUEUE], once=True, concurrency=threads)).run()
    drained = time.perf_counter()
    assert stats.processed == jobs, stats
    if batch_id is not None:
        batch = manager.find_batch(batch_id)
        assert batch is not None and batch.finished and batch.processed == jobs, batch
    return Run(dispatched - started, drained - dispatched)


def best(runs: list[Run], jobs: int) -> Run:
    return max(runs, key=lambda r: r.rate(jobs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--backends", default="redis,postgres")
    args = parser.parse_args()
    jobs = args.jobs
    print(f"load average: {os.getloadavg()[0]:.2f}; {jobs} jobs, {args.threads} threads, best of {args.repeat}")
    backends: list[tuple[str, Callable[[], Any]]] = [("redis", redis), ("postgres", postgres)]
    backends = [(name, open_backend) for name, open_backend in backends if name in args.backends.split(",")]
    for name, open_backend in backends:
        try:
            with open_backend() as (driver, locks):
                plains: list[Run] = []
                batches: list[Run] = []
                for index in range(args.repeat):
                    # Alternating which goes first, so a drift in the machine's speed falls on both.
                    for batched in (False, True) if index % 2 == 0 else (True, False):
                        (batches if batched else plains).append(run(driver, locks, jobs, args.threads, batched))
                plain, batched = best(plains, jobs), best(batches, jobs)
                paired = sorted(b.rate(jobs) / p.rate(jobs) for p, b in zip(plains, batches, strict=True))
        except Exception as exc:  # noqa: BLE001 - a benchmark skips what it cannot reach
            print(f"{name} skipped: {exc!r}")
            continue
        for label, figures in (("plain", plain), ("batch", batched)):
            print(
                f"{name:9s} {label}  {figures.rate(jobs):7.0f} jobs/s   "
                f"(dispatch {jobs / figures.dispatch:7.0f} jobs/s, drain {jobs / figures.drain:7.0f} jobs/s)"
            )
        quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        print(
            f"{name:9s} batch/plain paired run by run: median {statistics.median(paired):.0%} "
            f"(quartiles {quartiles[0]:.0%} .. {quartiles[2]:.0%}); "
            f"best of each {batched.rate(jobs) / plain.rate(jobs):.0%}"
        )
        print(f"{name:9s} paired: {', '.join(f'{r:.0%}' for r in paired)}")


if __name__ == "__main__":
    main()
