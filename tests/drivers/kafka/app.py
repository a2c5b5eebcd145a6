"""A worker process for the Kafka reliability tests (and the benchmark).

    python -m tests.drivers.kafka.app BROKERS GROUP PREFIX LOCK_URL LOCK_PREFIX OUT_FILE [--concurrency N]
        [--work-ms MS] [--lease S]

Runs a :class:`~rainier_sync.Worker` on queue ``drain`` until SIGTERM; every
attempt of ``kafka-test.record`` appends its ``n`` to ``OUT_FILE`` (one line,
one ``write``) before returning.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.kafka import KafkaQueue
from rainier_sync.locks import LockStore, MemoryLockStore, RedisLockStore

FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}

_out = {"fd": -1, "work": 0.0}


@dataclass
class Record(Job):
    NAME = "kafka-test.record"
    QUEUE = "drain"

    n: int

    def handle(self, context: JobContext) -> None:
        if _out["work"]:
            time.sleep(_out["work"])
        os.write(_out["fd"], f"{self.n}\n".encode())


def registry() -> JobRegistry:
    return JobRegistry().with_job(Record)


def build(brokers: str, group: str, prefix: str, locks: LockStore, lease: float = 90) -> KafkaQueue:
    return KafkaQueue(brokers, group=group, topic_prefix=prefix, lease=lease, locks=locks,
                      consumer_config=FAST_GROUP)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("brokers", "group", "prefix", "lock_url", "lock_prefix", "out"):
        parser.add_argument(name)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=90)
    args = parser.parse_args()
    _out["fd"] = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _out["work"] = args.work_ms / 1000
    locks: LockStore = MemoryLockStore()
    if args.lock_url != "memory":
        locks = RedisLockStore.from_url(args.lock_url, prefix=args.lock_prefix)
    queue = build(args.brokers, args.group, args.prefix, locks, args.lease)
    manager = QueueManager({"kafka": queue}, registry=registry(), container=Container())
    worker = Worker(manager, options=WorkerOptions(queues=["drain"], concurrency=args.concurrency, sleep=0.5,
                                                   grace=5))
    worker.install_signal_handlers()
    try:
        worker.run()
    finally:
        manager.close()
        os.close(_out["fd"])


if __name__ == "__main__":
    main()
