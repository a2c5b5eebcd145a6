"""The Kafka driver against tansu: configuration, commits, leases, rebalances, dead letters."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from rainier_sync import QueuedJob, _clock, signals
from rainier_sync.errors import ConfigurationError, PayloadError
from rainier_sync.locks import MemoryLockStore
from tests.services.tansu import FAST_GROUP
from tests.support import wait_until

kafka = pytest.importorskip("rainier_sync.drivers.kafka")
KafkaQueue = kafka.KafkaQueue


def queued(queue: str = "work", n: int = 0, *, delay: float = 0.0) -> QueuedJob:
    now = _clock.now()
    return QueuedJob(id=uuid.uuid4().hex, name="t.job", queue=queue, payload={"n": n}, max_attempts=3,
                     available_at=now + delay, dispatched_at=now)


def make(brokers: str, names: dict[str, str], locks: Any = None, **options: Any) -> Any:
    options.setdefault("consumer_config", FAST_GROUP)
    options.setdefault("producer_config", {"batch.num.messages": 1})
    return KafkaQueue(brokers, group=names["group"], topic_prefix=names["prefix"],
                      locks=locks if locks is not None else MemoryLockStore(), **options)


# -- configuration: refused at boot, naming what is wrong (no broker needed) -----------------------
def test_a_missing_lock_store_is_a_boot_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="lock store"):
        KafkaQueue("127.0.0.1:9092")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"brokers": ""}, "brokers is empty"),
        ({"brokers": "localhost"}, "'localhost' is not 'host:port'"),
        ({"lease": 0}, "lease"),
        ({"group": " "}, "group"),
        ({"topic_prefix": "bad prefix/"}, "topic_prefix"),
        ({"locks": object()}, "LockStore"),
    ],
)
def test_bad_settings_are_refused_by_name(options: dict[str, Any], named: str) -> None:
    settings: dict[str, Any] = {"brokers": "127.0.0.1:9092", "locks": MemoryLockStore(), **options}
    with pytest.raises(ConfigurationError, match=named):
        KafkaQueue(settings.pop("brokers"), **settings)


def test_a_queue_name_that_cannot_be_a_topic_is_refused_at_dispatch() -> None:
    q = KafkaQueue("127.0.0.1:9092", locks=MemoryLockStore())
    with pytest.raises(PayloadError, match="'mail box'"):
        q.push(queued("mail box"))


def test_without_the_extra_the_error_names_it() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['confluent_kafka'] = None\n"
        "import rainier_sync\n"
        "from rainier_sync.errors import DriverUnavailableError\n"
        "try:\n"
        "    from rainier_sync.drivers import KafkaQueue\n"
        "except DriverUnavailableError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'rainier_sync[kafka]'" in out.stdout, out.stderr


def test_the_driver_is_loaded_by_name() -> None:
    from rainier_sync import drivers

    assert drivers.KafkaQueue is KafkaQueue
    assert KafkaQueue.driver.survives_a_restart() and not KafkaQueue.driver.may_lose_an_accepted_job()


# -- against the broker -------------------------------------------------------------------------------
@pytest.mark.kafka
def test_commits_only_below_the_oldest_unfinished_job(kafka_brokers: str, names: dict[str, str]) -> None:
    q = make(kafka_brokers, names, partitions=1)
    try:
        jobs = [queued(n=i) for i in range(3)]
        q.push_many(jobs)
        taken = q.reserve_many(["work"], 3)
        assert [j.id for j in taken] == [j.id for j in jobs]
        q.acknowledge_many([taken[2], taken[1]])  # out of order: the oldest still runs
        assert q.size("work") == 3, "nothing may be committed past a job still running"
        q.acknowledge(taken[0])
        assert q.size("work") == 0
    finally:
        q.close()


@pytest.mark.kafka
def test_a_revoked_job_whose_lease_is_held_is_not_run_twice(kafka_brokers: str, names: dict[str, str]) -> None:
    locks = MemoryLockStore()
    first = make(kafka_brokers, names, locks, partitions=1, lease=30)
    second = make(kafka_brokers, names, locks, partitions=1, lease=30)
    try:
        job = queued()
        first.push(job)
        running = first.reserve(["work"])
        assert running is not None
        # The first worker's consumer leaves the group mid-job (a rebalance): the
        # partition moves to the second, which re-reads the uncommitted record.
        consumer = first._consumer
        first._consumer = None
        consumer.close()
        assert second.reserve(["work"]) is None, "the lease is held by a live worker: not run twice"
        first.acknowledge(running)  # finishes on the old worker, after its partition moved
        wait_until(lambda: second.reserve(["work"]) is None and second.size("work") == 0, timeout=10,
                   message="the new owner to see the job done and commit past it")
    finally:
        second.close()
        first.close()


def _frozen() -> Any:
    """Frozen time that still ticks: MemoryLockStore's leases follow the Python
    clock, so a test can make one lapse without waiting for it."""
    import datetime

    from freezegun import freeze_time

    return freeze_time(datetime.datetime.now(datetime.timezone.utc), tick=True)


@pytest.mark.kafka
def test_a_lapsed_lease_lets_the_job_run_again(kafka_brokers: str, names: dict[str, str]) -> None:
    locks = MemoryLockStore()
    with _frozen() as frozen:
        dead = make(kafka_brokers, names, locks, partitions=1, lease=30)
        alive = make(kafka_brokers, names, locks, partitions=1, lease=30)
        try:
            job = queued()
            dead.push(job)
            assert dead.reserve(["work"]) is not None
            consumer = dead._consumer  # the worker dies: it never renews the lease
            dead._consumer = None
            consumer.close()
            assert alive.reserve(["work"]) is None, "its lease is still held: not yet"
            frozen.tick(60)  # (a ticking freeze moves from its start time: leave a margin)
            got = alive.reserve_many(["work"], 1)
            assert [j.id for j in got] == [job.id]
            assert got[0].attempts == 2, "the attempt its dead worker was running counts"
            alive.acknowledge(got[0])
            assert alive.size("work") == 0
        finally:
            alive.close()
            dead.close()


@pytest.mark.kafka
def test_a_job_whose_workers_keep_dying_is_handed_out_spent_and_the_executor_fails_it(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    from rainier_sync import Container, JobRegistry
    from rainier_sync.execution import Executor

    locks = MemoryLockStore()
    failed: list[dict[str, Any]] = []

    def on_failed(sender: Any, **kw: Any) -> None:
        failed.append(kw)

    signals.job_failed.connect(on_failed)
    with _frozen() as frozen:
        dead = make(kafka_brokers, names, locks, partitions=1, lease=30)
        alive = make(kafka_brokers, names, locks, partitions=1, lease=30)
        try:
            job = replace(queued(), max_attempts=1)
            dead.push(job)
            assert dead.reserve(["work"]) is not None
            consumer = dead._consumer  # its only attempt dies with the worker
            dead._consumer = None
            consumer.close()
            assert alive.reserve(["work"]) is None
            frozen.tick(60)  # (a ticking freeze moves from its start time: leave a margin)
            [spent] = alive.reserve_many(["work"], 5)
            assert spent.id == job.id and spent.attempts == 2 > spent.max_attempts, "the lost attempt counts"
            executor = Executor(JobRegistry(), Container())
            completion = executor.run(spent)
            executor.apply(alive, completion)
            [entry] = alive.failed_jobs(10)
            assert entry.id == job.id and entry.exception.crashed and "worker lost" in entry.error
            assert [kw["job"].id for kw in failed] == [job.id] and failed[0]["exception"].crashed
            assert alive.size("work") == 0
        finally:
            signals.job_failed.disconnect(on_failed)
            alive.close()
            dead.close()


@pytest.mark.kafka
def test_a_record_that_is_not_our_json_is_discarded_dead_lettered_and_passed(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    q = make(kafka_brokers, names, partitions=1)
    seen: list[dict[str, Any]] = []

    def on_discarded(sender: Any, **kw: Any) -> None:
        seen.append(kw)

    signals.queue_message_discarded.connect(on_discarded)
    try:
        q._produce([(q.topic("work"), "junk", b"\x00not json{")])
        good = queued()
        q.push(good)
        got = q.reserve(["work"])
        assert got is not None and got.id == good.id, "the partition moves on past the bad record"
        assert len(seen) == 1 and "not valid JSON" in seen[0]["error"] and seen[0]["raw"].endswith("not json{")
        dead = q.failed_jobs(10)
        assert len(dead) == 1 and dead[0].id.startswith("unreadable-") and "not valid JSON" in dead[0].error
        q.acknowledge(got)
        assert q.size("work") == 0
        assert q.forget_failed(dead[0].id) and q.failed_count() == 0
    finally:
        signals.queue_message_discarded.disconnect(on_discarded)
        q.close()


@pytest.mark.kafka
def test_a_long_delay_is_cycled_through_the_delay_topic_and_still_runs_when_due(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    q = make(kafka_brokers, names, partitions=1, park_horizon=0.5)
    try:
        job = queued(delay=2.5)
        q.push(job)
        assert q.reserve(["work"]) is None
        got: list[QueuedJob] = []
        wait_until(lambda: bool(got.extend(q.reserve_many(["work"], 1)) or got), timeout=10,
                   message="the delayed job to come due")
        assert got[0].id == job.id and got[0].attempts == 1
        assert _clock.now() >= job.available_at
        q.acknowledge(got[0])
        q.reserve_many(["work"], 1)
        assert q.size("work") == 0, "the parked copies re-produced along the way are all committed"
    finally:
        q.close()


# -- through a worker -------------------------------------------------------------------------------------
attempts_seen: list[tuple[int, int, float]] = []


@pytest.mark.kafka
def test_a_worker_retries_after_the_backoff_then_dead_letters(kafka_brokers: str, names: dict[str, str]) -> None:
    from dataclasses import dataclass

    from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
    from rainier_sync.backoff import fixed

    @dataclass
    class Flaky(Job):
        NAME = "kafka-test.flaky"
        QUEUE = "work"
        TRIES = 3
        BACKOFF = fixed(1)

        n: int

        def handle(self, context: JobContext) -> None:
            attempts_seen.append((self.n, context.attempt, _clock.now()))
            if self.n == 1 or context.attempt < 2:
                raise RuntimeError(f"attempt {context.attempt} of {self.n}")

    attempts_seen.clear()
    q = make(kafka_brokers, names, partitions=2)
    manager = QueueManager({"kafka": q}, registry=JobRegistry().with_job(Flaky), container=Container())
    worker = Worker(manager, options=WorkerOptions(queues=["work"], concurrency=2, sleep=0.2))
    worker.start()
    try:
        manager.dispatch_many([Flaky(n=0), Flaky(n=1)])
        wait_until(lambda: worker.stats.processed == 1 and worker.stats.failed == 1, timeout=20,
                   message="one job to succeed on its 2nd attempt and the other to fail after 3")
    finally:
        worker.stop()
        worker.join(10)
    try:
        assert sorted((n, a) for n, a, _ in attempts_seen) == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3)]
        times = {(n, a): t for n, a, t in attempts_seen}
        assert times[(0, 2)] - times[(0, 1)] >= 1.0, "the retry waited out its backoff"
        assert worker.stats.released == 3
        dead = q.failed_jobs(10)
        assert [(f.name, f.payload, f.attempts) for f in dead] == [("kafka-test.flaky", {"n": 1}, 3)]
        assert dead[0].exception.kind == "RuntimeError" and "attempt 3 of 1" in dead[0].error
        assert q.size("work") == 0
        assert q.retry_failed(dead[0].id) and q.failed_jobs(10) == []
        assert q.size("work") == 1, "retried: queued again"
    finally:
        manager.close()


@pytest.mark.kafka
def test_a_lock_store_with_batch_operations_takes_leases_in_one_call(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    class BatchingLocks(MemoryLockStore):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, int]] = []

        def acquire_many(self, items: list[tuple[str, str]], ttl: float) -> list[bool]:
            self.calls.append(("acquire_many", len(items)))
            return [self.acquire(key, owner, ttl) for key, owner in items]

        def renew_many(self, items: list[tuple[str, str]], ttl: float) -> list[bool]:
            self.calls.append(("renew_many", len(items)))
            return [self.renew(key, owner, ttl) for key, owner in items]

    locks = BatchingLocks()
    q = make(kafka_brokers, names, locks, partitions=1)
    try:
        q.push_many([queued(n=i) for i in range(3)])
        taken = q.reserve_many(["work"], 3)
        assert len(taken) == 3 and locks.calls == [("acquire_many", 3)]
        q.extend(taken)
        assert locks.calls[-1] == ("renew_many", 3)
        q.acknowledge_many(taken)
    finally:
        q.close()


@pytest.mark.kafka
def test_topics_are_created_with_their_settings(kafka_brokers: str, names: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    q = make(kafka_brokers, names, partitions=3, topic_config={"retention.ms": "604800000"})
    try:
        q.push(queued(delay=60))
        q.push(queued())
        got = q.reserve(["work"])
        assert got is not None
        q.fail(got, "boom")
        admin = AdminClient({"bootstrap.servers": kafka_brokers})
        topics = admin.list_topics(timeout=10).topics
        prefix = names["prefix"]
        assert len(topics[prefix + "work"].partitions) == 3
        assert len(topics[prefix + "work.delayed"].partitions) == 3
        assert len(topics[prefix + "work.failed"].partitions) == 1

        def config(topic: str) -> dict[str, str]:
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            entries = admin.describe_configs([resource])[resource].result(timeout=10)
            return {k: v.value for k, v in entries.items()}

        assert config(prefix + "work")["retention.ms"] == "604800000"
        assert config(prefix + "work.failed")["cleanup.policy"] == "compact"
    finally:
        q.close()


@pytest.mark.kafka
def test_a_job_finished_after_its_partition_moved_is_not_run_again_later(
    kafka_brokers: str, names: dict[str, str]
) -> None:
    locks = MemoryLockStore()
    with _frozen() as frozen:
        first = make(kafka_brokers, names, locks, partitions=1, lease=5)
        second = make(kafka_brokers, names, locks, partitions=1, lease=5)
        try:
            first.push(queued())
            running = first.reserve(["work"])
            assert running is not None
            consumer = first._consumer
            first._consumer = None
            consumer.close()  # the partition leaves the first worker mid-job
            first.acknowledge(running)  # ... which finishes it afterwards
            frozen.tick(60)  # long past the job's own lease
            assert second.reserve(["work"]) is None, "done on the old owner: not run again"
            wait_until(lambda: second.reserve(["work"]) is None and second.size("work") == 0, timeout=10,
                       message="the new owner to commit past the finished job")
        finally:
            second.close()
            first.close()
