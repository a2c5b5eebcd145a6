"""A worker process for the Kafka reliability tests (and the benchmark).

    python -m tests.drivers.kafka.app BROKERS GROUP PREFIX LOCK_URL LOCK_PREFIX OUT_FILE [--concurrency N]
        [--prefetch N] [--work-ms MS] [--lease S] [--gate FILE --gate-after N] [--hold N --hold-file FILE]

Runs a :class:`~rainier_sync.Worker` on queue ``drain`` until SIGTERM; every
attempt of ``kafka-test.record`` appends its ``n`` to ``OUT_FILE`` (one line,
one ``write``) when it ends. ``--gate``: once this process has run N jobs,
each job waits (at most 60 s) for FILE to exist before it ends. ``--hold``:
job N waits the same way for ``--hold-file``. Jobs handed back unstarted are
counted on stderr ("gave back N job(s)").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from rainier_sync import Container, Job, JobContext, JobRegistry, QueuedJob, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.kafka import KafkaQueue
from rainier_sync.locks import LockStore, MemoryLockStore, RedisLockStore

FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}

_out: dict[str, Any] = {"fd": -1, "work": 0.0, "gate": None, "gate_after": 0, "hold": None, "hold_file": None,
                        "ran": 0}


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


@dataclass
class Record(Job):
    NAME = "kafka-test.record"
    QUEUE = "drain"

    n: int

    def handle(self, context: JobContext) -> None:
        if _out["work"]:
            time.sleep(_out["work"])
        _out["ran"] += 1
        if _out["gate"] and _out["ran"] > _out["gate_after"]:
            _wait_for(_out["gate"])
        if _out["hold"] == self.n and _out["hold_file"]:
            _wait_for(_out["hold_file"])
        os.write(_out["fd"], f"{self.n}\n".encode())


def registry() -> JobRegistry:
    return JobRegistry().with_job(Record)


class CountingKafkaQueue(KafkaQueue):
    """Says on stderr how many jobs a stopping worker handed back."""

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        super().give_back(jobs)
        sys.stderr.write(f"gave back {len(jobs)} job(s)\n")
        sys.stderr.flush()


def build(brokers: str, group: str, prefix: str, locks: LockStore, lease: float = 90,
          **options: Any) -> KafkaQueue:
    return CountingKafkaQueue(brokers, group=group, topic_prefix=prefix, lease=lease, locks=locks,
                              consumer_config=FAST_GROUP, **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("brokers", "group", "prefix", "lock_url", "lock_prefix", "out"):
        parser.add_argument(name)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=None)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=90)
    parser.add_argument("--gate", default=None)
    parser.add_argument("--gate-after", type=int, default=0)
    parser.add_argument("--hold", type=int, default=None)
    parser.add_argument("--hold-file", default=None)
    args = parser.parse_args()
    _out.update(fd=os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), work=args.work_ms / 1000,
                gate=args.gate, gate_after=args.gate_after, hold=args.hold, hold_file=args.hold_file)
    locks: LockStore = MemoryLockStore()
    if args.lock_url != "memory":
        locks = RedisLockStore.from_url(args.lock_url, prefix=args.lock_prefix)
    queue = build(args.brokers, args.group, args.prefix, locks, args.lease)
    manager = QueueManager({"kafka": queue}, registry=registry(), container=Container())
    worker = Worker(manager, options=WorkerOptions(queues=["drain"], concurrency=args.concurrency, sleep=0.5,
                                                   grace=5, prefetch=args.prefetch))
    worker.install_signal_handlers()
    try:
        worker.run()
    finally:
        manager.close()
        os.close(_out["fd"])


if __name__ == "__main__":
    main()
