"""Review findings: a lock-store error in reserve, and a stale fail()."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from rainier_sync.locks import MemoryLockStore
from tests.drivers.kafka.test_kafka_driver import _frozen, kafka, make, queued


class FlakyLocks(MemoryLockStore):
    """A MemoryLockStore whose acquire_many fails the next ``fail`` times."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0

    def acquire_many(self, items: Sequence[tuple[str, str]], ttl: float) -> list[bool]:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("lock store down")
        return super().acquire_many(items, ttl)


@pytest.mark.kafka
def test_a_lock_store_error_in_reserve_strands_no_record(kafka_brokers: str, names: dict[str, str]) -> None:
    locks = FlakyLocks()
    q = make(kafka_brokers, names, locks, partitions=1)
    try:
        job = queued()
        q.push(job)
        locks.fail = 1
        with pytest.raises(ConnectionError):
            q.reserve_many(["work"], 1)
        got = q.reserve_many(["work"], 1)
        assert [j.id for j in got] == [job.id], "the record read before the error is still handed out"
        q.acknowledge(got[0])
        assert q.size("work") == 0
    finally:
        q.close()


@pytest.mark.kafka
def test_a_lock_store_error_after_some_jobs_were_taken_hands_those_out(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    locks = FlakyLocks()
    q = make(kafka_brokers, names, locks, partitions=1)
    try:
        first, second = queued("high"), queued("low")
        q.push_many([first, second])
        q.reserve_many(["high", "low"], 0)  # join the group
        calls = [0]
        original = FlakyLocks.acquire_many

        def second_call_fails(items: Sequence[tuple[str, str]], ttl: float) -> list[bool]:
            calls[0] += 1
            if calls[0] == 2:
                raise ConnectionError("lock store down")
            return original(locks, items, ttl)

        locks.acquire_many = second_call_fails  # type: ignore[method-assign]
        got = q.reserve_many(["high", "low"], 2)
        assert [j.id for j in got] == [first.id], "the job whose lease was taken is handed out, not stranded"
        rest = q.reserve_many(["high", "low"], 2)
        assert [j.id for j in rest] == [second.id]
        q.acknowledge_many([*got, *rest])
    finally:
        q.close()


@pytest.mark.kafka
def test_a_stale_fail_stores_no_dead_letter_beside_the_running_copy(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    with _frozen() as frozen:
        q = make(kafka_brokers, names, MemoryLockStore(), partitions=1, lease=30)
        try:
            job = queued()
            q.push(job)
            slow = q.reserve(["work"])
            assert slow is not None
            frozen.tick(60)  # the slow worker never renewed: its lease lapses
            assert q.reclaim_expired() == 1
            again = q.reserve(["work"])
            assert again is not None and again.id == job.id
            q.fail(slow, "late failure of the lapsed attempt")
            assert q.failed_jobs(10) == [], "the job runs again elsewhere: a dead letter would be a second copy"
            q.acknowledge(again)
            assert q.size("work") == 0
        finally:
            q.close()


@pytest.mark.kafka
@pytest.mark.parametrize("settle", ["fail", "release"])
def test_a_worker_whose_partition_moved_and_lease_lapsed_writes_no_second_copy(
    kafka_brokers: str, names: dict[str, str], settle: str
) -> None:
    locks = MemoryLockStore()
    with _frozen() as frozen:
        slow = make(kafka_brokers, names, locks, partitions=1, lease=30)
        other = make(kafka_brokers, names, locks, partitions=1, lease=30)
        try:
            job = queued()
            slow.push(job)
            running = slow.reserve(["work"])
            assert running is not None
            consumer = slow._consumer  # its partition moves to the other worker mid-job
            slow._consumer = None
            consumer.close()
            assert other.reserve(["work"]) is None, "the lease is still held"
            frozen.tick(60)  # the slow worker's lease lapses: the other runs the job
            again = other.reserve_many(["work"], 1)
            assert [j.id for j in again] == [job.id]
            if settle == "fail":
                slow.fail(running, "late")
                assert other.failed_jobs(10) == [], "a dead letter beside the job running elsewhere"
            else:
                slow.release(running, 0)
                assert other.reserve_many(["work"], 5) == [], "a retry beside the job running elsewhere"
            other.acknowledge(again[0])
            assert other.size("work") == 0
        finally:
            other.close()
            slow.close()


@pytest.mark.kafka
@pytest.mark.parametrize("reclaimed_first", [False, True])
def test_a_late_heartbeat_takes_back_a_lapsed_lease_nobody_took(
    kafka_brokers: str, names: dict[str, str], reclaimed_first: bool
) -> None:
    with _frozen() as frozen:
        q = make(kafka_brokers, names, MemoryLockStore(), partitions=1, lease=30)
        try:
            job = queued()
            q.push(job)
            running = q.reserve(["work"])
            assert running is not None
            frozen.tick(60)  # a heartbeat comes late: the lease lapsed, nobody took it
            if reclaimed_first:
                assert q.reclaim_expired() == 1
            q.extend(running)
            assert q.reclaim_expired() == 0
            assert q.reserve_many(["work"], 5) == [], "the job still runs on its live worker: not twice"
            q.acknowledge(running)
            assert q.size("work") == 0
        finally:
            q.close()


@pytest.mark.kafka
def test_a_spent_job_is_handed_out_beside_the_others_for_the_executor_to_settle(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    from dataclasses import replace

    with _frozen() as frozen:
        q = make(kafka_brokers, names, MemoryLockStore(), partitions=1, lease=30)
        try:
            spent, other = replace(queued(), max_attempts=1), queued()
            q.push_many([other, spent])  # (reclaimed in reverse: the spent job comes first)
            assert len(q.reserve_many(["work"], 2)) == 2
            frozen.tick(60)  # the worker running both stopped renewing
            assert q.reclaim_expired() == 2
            got = {j.id: j for j in q.reserve_many(["work"], 2)}
            assert set(got) == {spent.id, other.id}, "neither is stranded"
            assert got[spent.id].attempts > got[spent.id].max_attempts
            q.fail(got[spent.id], "worker lost")
            q.acknowledge(got[other.id])
            assert [f.id for f in q.failed_jobs(10)] == [spent.id]
            assert q.size("work") == 0
        finally:
            q.close()


class NoRelease(MemoryLockStore):
    def release(self, key: str, owner: str) -> bool:
        raise ConnectionError("lock store down")


@pytest.mark.kafka
def test_close_leaves_the_group_even_when_the_lock_store_fails(kafka_brokers: str, names: dict[str, str]) -> None:
    q = make(kafka_brokers, names, NoRelease(), partitions=1, lease=30)
    q.push(queued())
    assert q.reserve(["work"]) is not None  # still running when the worker closes
    consumer = q._consumer
    q.close()
    with pytest.raises(RuntimeError, match="closed"):
        consumer.assignment()


class RefuseKeyOnce:
    """Wraps the driver's producer: the broker refuses one record, once."""

    def __init__(self, producer: Any, key: str) -> None:
        self.producer, self.key = producer, key.encode()

    def produce(self, topic: str, value: Any = None, key: Any = None, on_delivery: Any = None) -> None:
        if key == self.key:
            self.key = b""

            class Refused:
                def topic(self) -> str:
                    return topic

                def key(self) -> bytes:
                    return key

            on_delivery("record refused", Refused())
            return
        self.producer.produce(topic, value=value, key=key, on_delivery=on_delivery)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)


@pytest.mark.kafka
def test_a_partly_refused_re_production_of_parked_jobs_duplicates_none(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    with _frozen() as frozen:
        q = make(kafka_brokers, names, MemoryLockStore(), partitions=1, park_horizon=5)
        try:
            a, b = queued(delay=600), queued(delay=600)
            q.push_many([a, b])
            assert q.reserve_many(["work"], 5) == []  # both parked
            frozen.tick(10)  # past the park horizon: both are re-produced at the tail
            real = q._producer
            q._producer = RefuseKeyOnce(real, b.id)
            with pytest.raises(kafka.KafkaQueueError, match="refused"):
                q.reserve_many(["work"], 5)
            q._producer = real
            assert q.reserve_many(["work"], 5) == []  # re-produces what was refused
            keys = [m.key().decode() for m in q._read_topics([q.topic("work") + ".delayed"])]
            assert keys.count(a.id) == 2, "the original and one copy: a second copy would run the job twice"
            assert keys.count(b.id) == 2
        finally:
            q.close()


@pytest.mark.kafka
@pytest.mark.parametrize("settle", ["acknowledge", "fail"])
def test_a_late_settle_of_a_reclaimed_job_not_handed_out_again_counts(
    kafka_brokers: str, names: dict[str, str], settle: str
) -> None:
    with _frozen() as frozen:
        q = make(kafka_brokers, names, MemoryLockStore(), partitions=1, lease=30)
        try:
            job = queued()
            q.push(job)
            running = q.reserve(["work"])
            assert running is not None
            frozen.tick(60)  # its worker is slow: the lease lapses and the job is reclaimed
            assert q.reclaim_expired() == 1
            if settle == "acknowledge":
                q.acknowledge(running)  # ... and then it finishes
            else:
                q.fail(running, "it broke")
                assert [f.id for f in q.failed_jobs(10)] == [job.id]
            assert q.reserve_many(["work"], 5) == [], "settled by its worker: not run a second time"
            assert q.size("work") == 0
        finally:
            q.close()
