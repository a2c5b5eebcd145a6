"""Commits confirmed by the broker, re-sent when refused; listings and outages that say so."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time
from typing import Any

import pytest

from rainier_sync import Container, JobRegistry, QueueManager
from rainier_sync.errors import CapabilityError, QueueUnavailableError
from rainier_sync.locks import MemoryLockStore
from tests.drivers.kafka.test_kafka_driver import make, queued
from tests.services.tansu import Tansu, tansu_binary
from tests.support import freeze_process, wait_until

pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.kafka


def committed(q: Any, partition: int = 0) -> int:
    from confluent_kafka import TopicPartition

    [tp] = q._inspect().committed([TopicPartition(q.topic("work"), partition)], timeout=10)
    return int(tp.offset)


class RefuseCommits:
    """Wraps the driver's consumer: the broker refuses the next ``refuse``
    asynchronous commits (as it does, with UNKNOWN_MEMBER_ID, just after a
    restart); the refusal reaches the driver's ``on_commit`` on the next poll."""

    def __init__(self, consumer: Any, on_commit: Any, refuse: int) -> None:
        self.consumer, self.on_commit, self.refuse = consumer, on_commit, refuse
        self.refused: list[Any] = []
        self.sent = 0

    def commit(self, *args: Any, **kw: Any) -> Any:
        if kw.get("asynchronous", True):
            self.sent += 1
            if self.refuse:
                self.refuse -= 1
                self.refused.append(kw["offsets"])
                return None
        return self.consumer.commit(*args, **kw)

    def _deliver(self) -> None:
        from confluent_kafka import KafkaError

        while self.refused and self.on_commit is not None:
            self.on_commit(KafkaError(KafkaError.UNKNOWN_MEMBER_ID), self.refused.pop(0))

    def consume(self, *args: Any, **kw: Any) -> Any:
        self._deliver()
        return self.consumer.consume(*args, **kw)

    def poll(self, *args: Any, **kw: Any) -> Any:
        self._deliver()
        return self.consumer.poll(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


def test_a_refused_commit_is_sent_again(kafka_brokers: str, names: dict[str, str]) -> None:
    q = make(kafka_brokers, names, partitions=1)
    try:
        q.push_many([queued(n=i) for i in range(3)])
        taken = q.reserve_many(["work"], 3)
        assert len(taken) == 3
        proxy = RefuseCommits(q._consumer, q._consumer_config.get("on_commit"), refuse=1)
        q._consumer = proxy
        q.acknowledge_many(taken)
        assert committed(q) < 3

        def landed() -> bool:
            q.reserve_many(["work"], 1)
            return committed(q) == 3

        wait_until(landed, timeout=10, interval=0.05, message="the refused commit to be sent again and land")
        assert proxy.sent >= 2 and not proxy.refuse, "one commit refused, then one that landed"
        q._consumer = proxy.consumer
    finally:
        q.close()


def test_commits_are_coalesced_one_outstanding_at_a_time(kafka_brokers: str, names: dict[str, str]) -> None:
    q = make(kafka_brokers, names, partitions=2)
    try:
        q.push_many([queued(n=i) for i in range(200)])
        taken: list[Any] = []
        wait_until(lambda: bool(taken.extend(q.reserve_many(["work"], 50))) or len(taken) >= 200, timeout=20,
                   message="200 jobs")
        proxy = RefuseCommits(q._consumer, None, refuse=0)
        q._consumer = proxy
        for job in taken:  # one settle per job, with no poll between them to bring the broker's replies
            q.acknowledge_many([job])
        assert proxy.sent == 1, f"{proxy.sent} commits for 200 settles: one at a time, the next after the reply"
        wait_until(lambda: q.reserve_many(["work"], 1) == [] and committed(q, 0) + committed(q, 1) == 200,
                   timeout=10, message="the latest offsets to be committed once the first commit is answered")
        assert proxy.sent <= 5
        q._consumer = proxy.consumer
    finally:
        q.close()


# -- outages: a bounded wait, then an error naming the connection -------------------------------------------
@pytest.fixture
def private_tansu(tmp_path: pathlib.Path) -> Any:
    binary = tansu_binary()
    if binary is None:
        pytest.skip("no tansu binary")
    broker = Tansu(binary, tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        if broker.proc is not None:
            os.kill(broker.proc.pid, signal.SIGCONT)
        broker.stop()


def test_a_private_broker_is_never_another_process_answering_on_its_port(
    private_tansu: Tansu, tmp_path: pathlib.Path
) -> None:
    """The outage tests stop their own broker: one whose port another broker held
    (two tests picking the same free port) would stop nothing. A stand-in that
    never binds, still starting while the other broker answers, as a late bind
    failure looks on a busy machine, is not taken for a broker of ours."""
    slow = tmp_path / "slow-broker"
    slow.write_text("#!/bin/sh\nexec sleep 5\n")
    slow.chmod(0o755)
    stand_in = Tansu(str(slow), tmp_path)
    with pytest.raises(RuntimeError, match="tansu did not start"):
        stand_in.start(port=private_tansu.port, attempts=1)
    assert stand_in.proc is None


def test_dispatch_and_reserve_with_the_broker_down_raise_queue_unavailable_naming_the_connection(
    private_tansu: Tansu, names: dict[str, str]
) -> None:
    q = make(private_tansu.bootstrap, names, partitions=1, timeout=3)
    manager = QueueManager({"events": q}, registry=JobRegistry(), container=Container())
    try:
        q.push(queued())
        assert len(q.reserve_many(["work"], 5)) == 1
        assert private_tansu.proc is not None
        freeze_process(private_tansu.proc.pid)  # the broker stops answering
        started = time.monotonic()
        with pytest.raises(QueueUnavailableError, match="'events'"):
            q.push(queued())
        assert time.monotonic() - started < 20
        started = time.monotonic()
        with pytest.raises(QueueUnavailableError, match="'events'"):
            while time.monotonic() - started < 30:
                q.reserve_many(["work"], 5)
        assert time.monotonic() - started < 20
        started = time.monotonic()
        with pytest.raises(QueueUnavailableError, match="'events'"):
            q.failed_jobs(10)
        assert time.monotonic() - started < 20
    finally:
        os.kill(private_tansu.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        manager.close()


def in_thread(call: Any, wait: float) -> tuple[bool, list[BaseException]]:
    """Run ``call`` in a thread of its own; whether it ended within ``wait`` seconds, and what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait)
    return not thread.is_alive(), raised


def test_size_and_close_with_the_broker_frozen_end_within_the_timeout(
    private_tansu: Tansu, names: dict[str, str]
) -> None:
    """librdkafka's synchronous commit, and its close with a commit unanswered,
    wait without end for a coordinator that stopped answering: the driver waits
    ``timeout`` for the answer instead, then raises (size) or gives up (close)."""
    q = make(private_tansu.bootstrap, names, partitions=1, timeout=3)
    manager = QueueManager({"events": q}, registry=JobRegistry(), container=Container())
    assert private_tansu.proc is not None
    try:
        q.push_many([queued(n=0), queued(n=1)])
        jobs = q.reserve_many(["work"], 2)
        assert jobs
        freeze_process(private_tansu.proc.pid)  # the broker stops answering
        q.acknowledge_many(jobs)  # its commit goes out, and no answer comes
        ended, raised = in_thread(lambda: q.size("work"), 60)
        assert ended, "size() waits for the commit's answer at most timeout"
        assert len(raised) == 1 and isinstance(raised[0], QueueUnavailableError), raised
        assert "'events'" in str(raised[0]) and "not answered" in str(raised[0])
        ended, raised = in_thread(q.close, 60)
        assert ended, "close() ends although the broker never answers the commit it left outstanding"
        assert raised == []
    finally:
        os.kill(private_tansu.proc.pid, signal.SIGCONT)
        manager.close()
    # Answered at last, the consumer left closing in the background ends.
    wait_until(lambda: not any(t.name == "rainier-kafka-close" for t in threading.enumerate()), timeout=60,
               interval=0.05, message="the consumer left closing to end once the broker answers")


# -- done markers ------------------------------------------------------------------------------------------
def _frozen() -> Any:
    import datetime

    from freezegun import freeze_time

    return freeze_time(datetime.datetime.now(datetime.timezone.utc), tick=True)


def test_done_markers_and_the_reach_below_them_outlive_a_long_wait_for_the_commit(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    locks = MemoryLockStore()
    with _frozen() as frozen:
        first = make(kafka_brokers, names, locks, partitions=1, lease=30)
        second = make(kafka_brokers, names, locks, partitions=1, lease=30)
        first._session.reach_ttl = 60.0  # as short as the markers' life, to see it renewed
        try:
            slow, quick = queued(n=0), queued(n=1)
            first.push_many([slow, quick])
            running, done = first.reserve_many(["work"], 2)
            first.acknowledge(done)  # finished behind a job still running: not committed
            for _ in range(20):  # the slow job runs 200 s, far past the markers' life, renewing its lease
                frozen.tick(10)
                first.extend(running)
            # The first worker dies without a word: its partition goes to the second,
            # and the broker has lost the group's commits: only the reach tells the
            # second that the quick job, its lease long lapsed, may have run.
            first._let_go = lambda *args, **kw: None
            consumer, first._consumer = first._consumer, None
            consumer.close()
            for future in first._client.admin.delete_consumer_groups([names["group"]]).values():
                future.result(timeout=10)
            assert second.reserve_many(["work"], 5) == [], "the slow job still runs; the quick one is done"
        finally:
            second.close()
            first.close()


class NoValues(MemoryLockStore):
    """A lock store that keeps locks and nothing else (as a store of one's own may)."""

    def put_value(self, key: str, value: str, ttl: float) -> None:
        raise CapabilityError("this lock store cannot keep values (put_value)")

    def get_value(self, key: str) -> str | None:
        raise CapabilityError("this lock store cannot keep values (get_value)")


class ValuesUnreadable(MemoryLockStore):
    """A lock store whose values cannot be read (a failing call each time)."""

    def get_value(self, key: str) -> str | None:
        raise ConnectionError("the lock store does not answer")


@pytest.mark.parametrize("locks", [MemoryLockStore, NoValues, ValuesUnreadable],
                         ids=["reach", "no-values", "reach-unreadable"])
def test_a_job_finished_before_its_worker_died_is_passed_once_its_lease_lapsed(
    kafka_brokers: str, names: dict[str, str], locks: type[MemoryLockStore]
) -> None:
    """The broker lost the group's commits (as a crashed broker can), so its
    offsets say nothing of what ran there: the partition's reach in the lock
    store (or, in a store without values, a check of every record) has the next
    owner look for the finished job's done marker although its lease is free.
    So does a reach that cannot be read at the assignment: every record is checked."""
    store = locks()
    with _frozen() as frozen:
        first = make(kafka_brokers, names, store, partitions=1, lease=30)
        second = make(kafka_brokers, names, store, partitions=1, lease=30)
        try:
            slow, quick = queued(n=0), queued(n=1)
            first.push_many([slow, quick])
            running, done = first.reserve_many(["work"], 2)
            first.acknowledge(done)  # finished behind a job still running: not committed
            first._let_go = lambda *args, **kw: None  # dies without a word
            consumer, first._consumer = first._consumer, None
            consumer.close()
            for future in first._client.admin.delete_consumer_groups([names["group"]]).values():
                future.result(timeout=10)  # the group's committed offsets are gone
            frozen.tick(31)  # both leases lapse; the done marker lives max(lease, 60) s
            again = second.reserve_many(["work"], 5)
            assert [job.id for job in again] == [slow.id], "the job that died runs again; the finished one not"
            second.acknowledge(again[0])
            assert second.reserve_many(["work"], 5) == []
            second._session.commit_now()
            assert committed(second) == 2, "the finished job is committed past without running"
        finally:
            second.close()
            first.close()


class CountingStore(MemoryLockStore):
    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.puts: list[str] = []

    def renew_many(self, items: Any, ttl: float) -> list[bool]:
        self.checks += sum(1 for key, _ in items if ":done:" in key)
        return super().renew_many(items, ttl)

    def put_value(self, key: str, value: str, ttl: float) -> None:
        self.puts.append(value)
        super().put_value(key, value, ttl)


def test_a_drain_on_one_assignment_checks_no_done_marker_and_stores_its_reach_once_per_1000_records(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    store = CountingStore()
    q = make(kafka_brokers, names, store, partitions=1, buffer=600)
    try:
        q.push_many([queued(n=i) for i in range(1500)])
        ran = 0
        while ran < 1500:
            jobs = q.reserve_many(["work"], 200)
            assert jobs, f"the drain stopped after {ran} jobs"
            q.acknowledge_many(jobs)
            ran += len(jobs)
        assert store.checks == 0, "no record past the reach can have run elsewhere"
        # Set 1,000 past the last record of the batch that reached it (at most offset 199,
        # then one past the first reach): twice for 1,500 records.
        assert len(store.puts) == 2, f"the reach, stored once per 1,000 records: {store.puts}"
        first, second = (int(value) for value in store.puts)
        assert 1000 < first <= 1200 and second > first + 1000
    finally:
        q.close()


@pytest.mark.slow
def test_listing_dead_letters_on_s3_storage_reads_to_the_end_offset(tansu_s3: Any, names: dict[str, str]) -> None:
    from rainier_sync.types import encode

    q = make(tansu_s3.bootstrap, names, partitions=1)
    try:
        topic = q.topic("work") + ".failed"
        for i in range(60):  # one batch each: tansu stores each as an S3 object of its own
            body = {"id": f"job-{i}", "name": "t.job", "queue": "work", "payload": {"n": i}, "error": "boom",
                    "exception": {"kind": "RuntimeError", "message": "boom"}, "failed_at": 1.0 + i}
            q._produce([(topic, f"job-{i}", encode({"failed": body}).encode())])
        # tansu's end offset on S3 can stop short of the last records (see
        # docs/drivers/kafka.rst): a listing reads to the end offset it sees.
        from confluent_kafka import TopicPartition

        _, end = q._inspect().get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        assert end > 0
        assert end <= q.failed_count() <= 60, "a listing reads to the end offset, or says it could not"
    finally:
        q.close()
