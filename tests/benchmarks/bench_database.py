"""Database driver benchmark: dispatch, dispatch_many, drain, idle wake-up, backlog.

    .venv/bin/python tests/benchmarks/bench_database.py [--dialects postgres,sqlite,sqlite-full]
        [--jobs 10000] [--threads 8] [--probes 200] [--backlog 100000] [--batch 72]

For each dialect (PostgreSQL in a schema of its own, SQLite WAL with
``synchronous=NORMAL`` and with ``FULL``, each on a fresh file):

- ``dispatch``: ``manager.dispatch`` one job at a time.
- ``dispatch_many``: ``manager.dispatch_many`` in batches of 1,000.
- ``push_many``: the driver alone, ``push_many`` of jobs built beforehand,
  1,000 per call (what ``dispatch_many`` costs without the manager's work).
- ``drain``: one :class:`~rainier_sync.Worker` with ``--threads`` threads runs
  ``--jobs`` no-op jobs from a full queue to empty (``once`` mode); median of 5.
- ``claim+ack``: the driver alone, one thread: ``acknowledge_and_reserve`` of
  the previous batch and the next ``--batch`` jobs (72: what a worker of 8
  threads claims at most, 8 for its threads and 64 ahead) until empty, the
  driver's ceiling without the worker; median of 3, interleaved with the next one.
- ``claim+ack backlog``: the same loop for ``--jobs`` jobs with ``--backlog``
  more ready jobs behind them.
- ``backlog drain``: the same drain of ``--jobs`` jobs with ``--backlog`` more
  ready jobs behind them (``max_jobs``), against the empty-queue drain; both
  medians of 5, interleaved.
- ``idle latency``: an idle worker (its own connection, ``sleep`` 60 s, so only
  the driver's wake-up starts the job early) and one probe at a time, a random
  0-20 ms apart: from just before ``dispatch`` to the first line of ``handle``.

PostgreSQL: ``TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import urllib.parse
import uuid
from typing import Callable

from benchjobs import Noop, Probe, percentile, probe_started, started_at

from rainier_sync import Container, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.types import QueuedJob

REGISTRY = JobRegistry().with_job(Noop).with_job(Probe)


class Target:
    """One database to measure: makes fresh, migrated, empty queues."""

    def __init__(self, dialect: str, workdir: str) -> None:
        self.dialect = dialect
        self.cleanup: Callable[[], None] = lambda: None
        if dialect == "postgres":
            import psycopg

            base = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
            schema = f"rainier_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{schema}"')
            parts = urllib.parse.urlsplit(base)
            query = urllib.parse.urlencode({"options": f"-c search_path={schema}"}, quote_via=urllib.parse.quote)
            self.url = urllib.parse.urlunsplit(parts._replace(query=query))

            def drop() -> None:
                with psycopg.connect(base, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

            self.cleanup = drop
        else:
            sync = "FULL" if dialect == "sqlite-full" else "NORMAL"
            self.url = f"sqlite:///{os.path.join(workdir, dialect + '.db')}?synchronous={sync}"
        queue = DatabaseQueue.from_url(self.url)
        queue.migrate()
        queue.close()

    def manager(self) -> QueueManager:
        queue = DatabaseQueue.from_url(self.url)
        for table in ("rainier_jobs", "rainier_failed_jobs", "rainier_locks"):
            queue._backend.execute(f"DELETE FROM {table}")
        if self.dialect == "postgres":
            queue._backend.execute("VACUUM ANALYZE rainier_jobs")
        return QueueManager({"db": queue}, registry=REGISTRY, container=Container())


def fill(manager: QueueManager, n: int) -> None:
    for start in range(0, n, 1000):
        manager.dispatch_many([Noop() for _ in range(min(1000, n - start))])


def bench_dispatch(target: Target, n: int) -> float:
    m = target.manager()
    started = time.perf_counter()
    for _ in range(n):
        m.dispatch(Noop())
    rate = n / (time.perf_counter() - started)
    m.close()
    return rate


def bench_dispatch_many(target: Target, n: int) -> float:
    m = target.manager()
    started = time.perf_counter()
    fill(m, n)
    rate = n / (time.perf_counter() - started)
    m.close()
    return rate


def bench_push_many(target: Target, n: int) -> float:
    """The driver alone: ``push_many`` of prepared jobs, 1,000 per call (no manager)."""
    m = target.manager()
    queue = m.connection()
    jobs = [QueuedJob(id=uuid.uuid4().hex, name="bench.noop", queue="default", payload={}) for _ in range(n)]
    started = time.perf_counter()
    for start in range(0, n, 1000):
        queue.push_many(jobs[start : start + 1000])
    rate = n / (time.perf_counter() - started)
    m.close()
    return rate


def bench_drain(target: Target, n: int, threads: int, backlog: int = 0) -> float:
    m = target.manager()
    fill(m, n + backlog)
    worker = Worker(m, options=WorkerOptions(concurrency=threads, once=True, max_jobs=n if backlog else None))
    started = time.perf_counter()
    stats = worker.run()
    rate = stats.processed / (time.perf_counter() - started)
    assert stats.processed == n, stats
    m.close()
    return rate


def bench_claim_ack(target: Target, n: int, batch: int, backlog: int = 0) -> float:
    m = target.manager()
    fill(m, n + backlog)
    queue = m.connection()
    done = 0
    held: list[QueuedJob] = []
    started = time.perf_counter()
    while done < n:
        held = queue.acknowledge_and_reserve(held, ["default"], min(batch, n - done))
        if not held:
            break
        done += len(held)
    queue.acknowledge_many(held)
    rate = done / (time.perf_counter() - started)
    assert done == n
    m.close()
    return rate


def with_and_without_backlog(
    name: str, measure: Callable[..., float], *args: object, backlog: int, repeat: int = 3
) -> dict[str, float]:
    """``measure(*args, backlog=0)`` and with ``backlog``, interleaved, medians of ``repeat``."""
    empty, behind = [], []
    for _ in range(repeat):
        empty.append(measure(*args, backlog=0))
        behind.append(measure(*args, backlog=backlog))
    label = {"drain": "backlog drain"}.get(name, f"{name} backlog")
    return {name: statistics.median(empty), label: statistics.median(behind)}


def bench_latency(target: Target, probes: int, threads: int) -> tuple[float, float]:
    producer = target.manager()
    worker_side = QueueManager({"db": DatabaseQueue.from_url(target.url)}, registry=REGISTRY, container=Container())
    worker = Worker(worker_side, options=WorkerOptions(concurrency=threads, sleep=60))
    worker.start()
    rng = random.Random(7)
    latencies: list[float] = []
    time.sleep(0.3)
    for _ in range(probes + 5):
        time.sleep(rng.uniform(0, 0.02))
        probe_started.clear()
        sent = time.perf_counter()
        producer.dispatch(Probe())
        if not probe_started.wait(10):
            raise RuntimeError("a probe did not start within 10 s")
        latencies.append(started_at[-1] - sent)
    worker.stop()
    worker.join(10)
    producer.close()
    worker_side.close()
    latencies = latencies[5:]  # warm-up
    return percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialects", default="postgres,sqlite,sqlite-full")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=72)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores: {os.cpu_count()}")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for dialect in args.dialects.split(","):
            target = Target(dialect, workdir)
            try:
                row = {
                    "dialect": dialect,
                    "dispatch": bench_dispatch(target, min(args.jobs, 5000)),
                    "dispatch_many": bench_dispatch_many(target, args.jobs * 5),
                    "push_many": bench_push_many(target, args.jobs * 5),
                    **with_and_without_backlog(
                        "drain", bench_drain, target, args.jobs, args.threads, backlog=args.backlog, repeat=5
                    ),
                    **with_and_without_backlog(
                        "claim+ack", bench_claim_ack, target, args.jobs, args.batch, backlog=args.backlog
                    ),
                }
                row["backlog / empty"] = row["backlog drain"] / row["drain"]
                p50, p99 = bench_latency(target, args.probes, args.threads)
                row["latency p50 ms"], row["latency p99 ms"] = p50, p99
                rows.append(row)
                print(f"{dialect}: done", flush=True)
            finally:
                target.cleanup()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    heads = [
        "dialect",
        "dispatch",
        "dispatch_many",
        "push_many",
        "drain",
        "claim+ack",
        "claim+ack backlog",
        "backlog drain",
        "backlog / empty",
        "latency p50 ms",
        "latency p99 ms",
    ]
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---" for _ in heads) + "|")
    for row in rows:
        cells = []
        for h in heads:
            v = row[h]
            if isinstance(v, str):
                cells.append(v)
            elif h == "backlog / empty":
                cells.append(f"{v:.2f}")
            elif "ms" in h:
                cells.append(f"{v:.2f}")
            else:
                cells.append(f"{v:,.0f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
