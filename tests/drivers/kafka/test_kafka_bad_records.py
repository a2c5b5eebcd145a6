"""Records that cannot be read: each goes alone to the dead-letter topic, and every good job around it runs."""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, _clock, signals
from rainier_sync.locks import MemoryLockStore
from tests.drivers.kafka.test_kafka_driver import make, queued
from tests.support import wait_until

pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.kafka

DEEP = b"[" * 100_000 + b"]" * 100_000
TOO_DEEP = re.compile("too deeply|RecursionError")


def envelope(**fields: Any) -> bytes:
    now = _clock.now()
    body: dict[str, Any] = {"id": uuid.uuid4().hex, "name": "t.job", "queue": "work", "payload": {},
                            "attempts": 0, "max_attempts": 3, "available_at": now, "dispatched_at": now}
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


def take_all(q: Any, want: int, timeout: float = 30) -> list[Any]:
    taken: list[Any] = []

    def more() -> bool:
        taken.extend(q.reserve_many(["work"], 200))
        return len(taken) >= want

    wait_until(more, timeout=timeout, interval=0.01, message=f"{want} jobs to be handed out")
    return taken


def test_a_record_nested_100000_deep_goes_alone_to_the_dead_letters_and_its_batch_runs(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    q = make(kafka_brokers, names, partitions=1, producer_config={})  # one produce batch around the bad record
    seen: list[dict[str, Any]] = []

    def on_discarded(sender: Any, **kw: Any) -> None:
        seen.append(kw)

    signals.queue_message_discarded.connect(on_discarded)
    try:
        before, after = [queued(n=i) for i in range(300)], [queued(n=i) for i in range(300, 600)]
        q._produce([*(q._job_record(j, _clock.now()) for j in before), (q.topic("work"), "deep", DEEP),
                    *(q._job_record(j, _clock.now()) for j in after)])
        taken = take_all(q, 600)
        assert [j.id for j in taken] == [j.id for j in before + after], "every good job of the batch is handed out"
        assert len(seen) == 1 and TOO_DEEP.search(seen[0]["error"]), seen[0]["error"]
        [dead] = q.failed_jobs(10)
        assert dead.id.startswith("unreadable-") and TOO_DEEP.search(dead.error)
        q.acknowledge_many(taken)
        wait_until(lambda: q.reserve_many(["work"], 10) == [] and q._inspect().committed(
            [kafka_tp(q.topic("work"), 0)], timeout=10)[0].offset == 601, timeout=10,
            message="the commit to pass every record, the bad one included")
    finally:
        signals.queue_message_discarded.disconnect(on_discarded)
        q.close()


def kafka_tp(topic: str, partition: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"attempts": -5}, "attempts"),
        ({"attempts": 10**12}, "attempts"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_a_record_with_an_impossible_attempt_count_is_dead_lettered_with_the_reason(
    kafka_brokers: str, names: dict[str, str], fields: dict[str, Any], reason: str
) -> None:
    q = make(kafka_brokers, names, partitions=1)
    try:
        good = queued()
        q._produce([(q.topic("work"), "bad", envelope(**fields)), q._job_record(good, _clock.now())])
        [got] = take_all(q, 1)
        assert got.id == good.id and got.attempts == 1
        [dead] = q.failed_jobs(10)
        assert dead.id.startswith("unreadable-") and reason in dead.error, dead.error
        q.acknowledge(got)
    finally:
        q.close()


# -- through a worker, on every partition ---------------------------------------------------------------
ran: list[int] = []


@dataclass
class Good(Job):
    NAME = "kafka-bad.good"
    QUEUE = "work"
    TRIES = 3

    n: int

    def handle(self, context: JobContext) -> None:
        ran.append(self.n)


BAD = {
    "not JSON": (b"\x00not json{", "not valid JSON"),
    "unknown name": (None, "no.such.job"),
    "100,000 deep": (DEEP, "too deeply"),
    "missing fields": (b'{"id": "x", "queue": "work"}', "'name'"),
    "negative attempts": (None, "attempts"),
}


def test_bad_records_on_every_partition_are_dead_lettered_and_every_good_job_runs(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    from confluent_kafka import Producer

    ran.clear()
    lease = 20.0
    partitions = 4
    q = make(kafka_brokers, names, MemoryLockStore(), partitions=partitions, lease=lease)
    manager = QueueManager({"kafka": q}, registry=JobRegistry().with_job(Good), container=Container())
    q._ensure_topics([q.topic("work"), q.topic("work") + ".delayed"])
    producer = Producer({"bootstrap.servers": kafka_brokers, "linger.ms": 5})
    good = 0
    expected: dict[str, str] = {}
    for p in range(partitions):
        for kind, (raw, reason) in BAD.items():
            for _ in range(20):
                producer.produce(q.topic("work"), value=_good_wire(good), key=str(good), partition=p)
                good += 1
            if kind == "unknown name":
                job_id = f"unknown-{p}"
                raw = envelope(id=job_id, name="no.such.job")
                expected[job_id] = reason
            elif kind == "negative attempts":
                raw = envelope(attempts=-5, name=Good.NAME, payload={"n": -1})
                expected[f"{kind}-{p}"] = reason
            else:
                expected[f"{kind}-{p}"] = reason
            producer.produce(q.topic("work"), value=raw, key=f"bad-{p}", partition=p)
        for _ in range(20):
            producer.produce(q.topic("work"), value=_good_wire(good), key=str(good), partition=p)
            good += 1
    assert producer.flush(30) == 0
    worker = Worker(manager, options=WorkerOptions(queues=["work"], concurrency=4, sleep=0.2))
    started = time.monotonic()
    worker.start()
    try:
        wait_until(lambda: len(set(ran)) >= good and len(q.failed_jobs(100)) >= len(expected), timeout=lease,
                   interval=0.1, message="every good job to run and every bad record to be dead-lettered")
    finally:
        worker.stop()
        worker.join(15)
        manager.close()
    assert time.monotonic() - started < lease + 5
    assert sorted(ran) == list(range(good)), "every good job runs, once"
    dead = q.failed_jobs(100)
    reasons = sorted(d.error for d in dead)
    assert len(dead) == len(expected), reasons
    for reason in set(BAD[k][1] for k in BAD):
        assert sum(reason in d.error for d in dead) == partitions, (reason, reasons)
    unknown = {d.id for d in dead if "no.such.job" in d.error}
    assert unknown == {f"unknown-{p}" for p in range(partitions)}


def _good_wire(n: int) -> bytes:
    now = _clock.now()
    return json.dumps({"id": uuid.uuid4().hex, "name": Good.NAME, "queue": "work", "payload": {"n": n},
                       "attempts": 0, "max_attempts": 3, "available_at": now, "dispatched_at": now}).encode()
