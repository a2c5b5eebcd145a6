"""What the worker registry and the fleet's counters cost a worker's drain, on Redis and PostgreSQL.

    .venv/bin/python tests/benchmarks/bench_fleet.py [--backends redis,postgres] [--jobs 50000]
        [--threads 8] [--repeat 9]

For each backend, a manager with a lock store on the same server (a
``RedisLockStore`` under the queue's key prefix, a ``DatabaseLockStore`` in the
queue's PostgreSQL schema) and ``--jobs`` no-op jobs; one worker of
``--threads`` threads drains them (``once``), timed from ``run()`` to its
return. Runs alternate between the worker as shipped (it records itself every
few seconds and adds its per-minute counts and wait-time buckets with each
refresh) and the same worker with its fleet recorder taken away (no record,
no counts): the difference is what the registry and the counters cost.
PostgreSQL's tables are truncated between runs, so no run claims through the
rows the last one left dead. Figures: medians of ``--repeat`` each; the median
of the costs paired run by run, with its quartiles (on a busy 2-core machine
one run differs from the next by more than the cost); and the share of the
runs' time that the owning loop spent in the recorder, which is what the fleet
takes from its claims. The load average is printed before and after.

Redis: ``REDIS_URL`` (default ``redis://127.0.0.1:6379/13``); PostgreSQL:
``TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
import urllib.parse
import uuid
from typing import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from benchjobs import Noop  # noqa: E402

from rainier_sync import Container, JobRegistry, QueueManager, Worker, WorkerOptions  # noqa: E402
from rainier_sync.fleet import FleetRecorder  # noqa: E402

REGISTRY = JobRegistry().with_job(Noop)


def redis_manager() -> tuple[QueueManager, Callable[[], None], Callable[[], None]]:
    from rainier_sync.drivers.redis import RedisQueue
    from rainier_sync.locks import RedisLockStore

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
    prefix = f"bench:{uuid.uuid4().hex[:10]}:"
    driver = RedisQueue.from_url(url, prefix=prefix)
    locks = RedisLockStore.from_url(url, prefix=prefix + "lock:")
    manager = QueueManager({"redis": driver}, registry=REGISTRY, container=Container(), locks=locks)

    def cleanup() -> None:
        keys = list(driver.client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            driver.client.delete(*keys)
        manager.close()

    return manager, lambda: None, cleanup


def postgres_manager() -> tuple[QueueManager, Callable[[], None], Callable[[], None]]:
    import psycopg

    from rainier_sync.drivers.database import DatabaseQueue
    from rainier_sync.locks import DatabaseLockStore

    base = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"rainier_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    parts = urllib.parse.urlsplit(base)
    query = urllib.parse.urlencode({"options": f"-c search_path={schema}"}, quote_via=urllib.parse.quote)
    url = urllib.parse.urlunsplit(parts._replace(query=query))
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    locks = DatabaseLockStore.from_url(url)
    locks.migrate()
    manager = QueueManager({"db": queue}, registry=REGISTRY, container=Container(), locks=locks)

    def vacuum() -> None:
        # A drain leaves every row it claimed dead: without this, each run claims through more of them.
        queue._backend.execute("TRUNCATE rainier_jobs, rainier_tallies, rainier_values, rainier_flags")
        queue._backend.execute("ANALYZE rainier_jobs")
        # The last run's writes flushed now, rather than by a checkpoint in the middle of the next run.
        queue._backend.execute("CHECKPOINT")

    def cleanup() -> None:
        manager.close()
        locks.close()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return manager, vacuum, cleanup


BACKENDS = {"redis": redis_manager, "postgres": postgres_manager}


class Spent:
    """The time the owning loop spends in the fleet recorder, summed over the runs with one."""

    def __init__(self) -> None:
        self.recorder = 0.0
        self.runs = 0.0

    def install(self) -> None:
        count, leave = FleetRecorder.count, FleetRecorder.leave

        def timed(method: Callable[..., None]) -> Callable[..., None]:
            def call(recorder: FleetRecorder, *args: object) -> None:
                started = time.perf_counter()
                method(recorder, *args)
                self.recorder += time.perf_counter() - started

            return call

        FleetRecorder.count = timed(count)  # type: ignore[method-assign]
        FleetRecorder.leave = timed(leave)  # type: ignore[method-assign]


SPENT = Spent()


def drain(manager: QueueManager, jobs: int, threads: int, fleet: bool) -> tuple[float, float]:
    """Jobs per second, and this process's CPU microseconds per job (the backend's server not included)."""
    for start in range(0, jobs, 1000):
        manager.dispatch_many([Noop() for _ in range(min(1000, jobs - start))])
    worker = Worker(manager, options=WorkerOptions(concurrency=threads, once=True))
    if not fleet:
        # The worker as it would be without the registry and counters (private
        # attributes: only a benchmark takes them away).
        worker.fleet = worker._loop._fleet = None
        worker._claims._count = None
        worker.attempts.started = None
    started, cpu = time.perf_counter(), time.process_time()
    stats = worker.run()
    elapsed = time.perf_counter() - started
    if fleet:
        SPENT.runs += elapsed
    rate = stats.processed / elapsed
    spent = (time.process_time() - cpu) / stats.processed * 1e6
    assert stats.processed == jobs, stats
    return rate, spent


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="redis,postgres")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    import rainier_sync

    print(f"rainier_sync from {pathlib.Path(rainier_sync.__file__).parent}")
    print(f"load average before: {loadavg()}; cores: {os.cpu_count()}")
    rows = []
    SPENT.install()
    spent: dict[str, float] = {}
    for name in args.backends.split(","):
        SPENT.recorder = SPENT.runs = 0.0
        manager, between, cleanup = BACKENDS[name]()
        try:
            drain(manager, min(args.jobs, 2000), args.threads, True)  # warm-up: connections, caches
            between()
            on: list[tuple[float, float]] = []
            off: list[tuple[float, float]] = []
            for index in range(args.repeat):
                # Alternate which goes first, so a trend in the machine's load falls on both.
                order = (True, False) if index % 2 == 0 else (False, True)
                for fleet in order:
                    (on if fleet else off).append(drain(manager, args.jobs, args.threads, fleet))
                    between()
        finally:
            cleanup()
        rows.append((name, off, on))
        spent[name] = SPENT.recorder / SPENT.runs * 100
        print(f"{name}: done, load average {loadavg()}", flush=True)
    print(f"load average after: {loadavg()}")
    print("| backend | no fleet: jobs/s | fleet: jobs/s | cost | no fleet: CPU µs/job | fleet: CPU µs/job | cost |")
    print("|---|---|---|---|---|---|---|")
    for name, off, on in rows:
        rate_off, rate_on = (statistics.median(r for r, _ in runs) for runs in (off, on))
        cpu_off, cpu_on = (statistics.median(c for _, c in runs) for runs in (off, on))
        print(
            f"| {name} | {rate_off:,.0f} | {rate_on:,.0f} | {(rate_off - rate_on) / rate_off * 100:+.1f}% "
            f"| {cpu_off:.1f} | {cpu_on:.1f} | {(cpu_on - cpu_off) / cpu_off * 100:+.1f}% |"
        )
    for name, off, on in rows:
        # Each run of one against the run of the other next to it: a drift in the machine's load cancels out.
        paired = sorted((r_off - r_on) / r_off * 100 for (r_off, _), (r_on, _) in zip(off, on, strict=True))
        quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        print(
            f"{name}: cost paired run by run, median {statistics.median(paired):+.1f}% "
            f"(quartiles {quartiles[0]:+.1f}% .. {quartiles[2]:+.1f}%)"
        )
    for name, share in spent.items():
        print(f"{name}: the owning loop spent {share:.2f}% of the fleet runs' time in the recorder (count, leave)")
    for name, off, on in rows:
        print(f"{name} runs, no fleet: {', '.join(f'{r:,.0f} ({c:.1f} µs)' for r, c in off)}")
        print(f"{name} runs, fleet:    {', '.join(f'{r:,.0f} ({c:.1f} µs)' for r, c in on)}")


if __name__ == "__main__":
    main()
