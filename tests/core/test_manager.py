from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import pytest
from freezegun import freeze_time

import rainier_sync
from rainier_sync import (
    Container,
    Job,
    JobContext,
    JobRegistry,
    NoQueueConfiguredError,
    QueuedJob,
    QueueManager,
    UnknownConnectionError,
)
from rainier_sync.drivers import MemoryQueue, SyncQueue
from rainier_sync.drivers.base import BaseQueue

from . import jobs


def test_dispatch_returns_the_id_and_uses_the_jobs_queue(manager: QueueManager, memory: MemoryQueue) -> None:
    job_id = manager.dispatch(jobs.Flaky())
    assert isinstance(job_id, str) and job_id
    (queued,) = memory.jobs
    assert (queued.id, queued.name, queued.queue, queued.max_attempts) == (job_id, "tests.flaky", "default", 3)
    assert queued.connection == "main"


def test_dispatch_on_and_after(manager: QueueManager, memory: MemoryQueue) -> None:
    with freeze_time("2026-05-01 10:00:00"):
        manager.dispatch_on("high", jobs.Record(1))
        manager.dispatch_after(timedelta(minutes=1), jobs.Record(2))
        manager.dispatch_after(30, jobs.Record(3))
        by_value = {j.payload["value"]: j for j in memory.jobs}
        assert by_value[1].queue == "high"
        now = rainier_sync._clock.now()
        assert by_value[2].available_at == now + 60
        assert by_value[3].available_at == now + 30


def test_the_pending_builder(manager: QueueManager, memory: MemoryQueue) -> None:
    with freeze_time("2026-05-01 10:00:00"):
        job_id = (
            manager.pending(jobs.Record(1)).on_queue("high").on_connection("main").delay(30).tries(10).priority(-5).send()
        )
        (queued,) = memory.jobs
        assert queued.id == job_id
        assert (queued.queue, queued.max_attempts, queued.priority) == ("high", 10, -5)
        assert queued.available_at == rainier_sync._clock.now() + 30


def test_the_builder_refuses_bad_values(manager: QueueManager) -> None:
    pending = manager.pending(jobs.Record())
    with pytest.raises(ValueError, match="delay must not be negative"):
        pending.delay(-1)
    with pytest.raises(ValueError, match="tries must be an int >= 1"):
        pending.tries(0)
    with pytest.raises(TypeError, match="priority must be an int"):
        pending.priority("high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue must be a non-empty string"):
        pending.on_queue("")


def test_an_undeclared_connection_is_an_error_never_the_default(manager: QueueManager, memory: MemoryQueue) -> None:
    with pytest.raises(UnknownConnectionError, match="'bulk' is not declared \\(declared: main\\)"):
        manager.pending(jobs.Record()).on_connection("bulk").send()
    assert memory.size() == 0


def test_several_connections(registry: Any) -> None:
    primary, bulk = MemoryQueue(), MemoryQueue()
    manager = QueueManager({"primary": primary, "bulk": bulk}, "primary", registry, Container())
    manager.dispatch(jobs.Record(1))
    manager.pending(jobs.Record(2)).on_connection("bulk").send()
    assert [j.payload["value"] for j in primary.jobs] == [1]
    assert [j.payload["value"] for j in bulk.jobs] == [2]
    assert bulk.jobs[0].connection == "bulk"
    with pytest.raises(UnknownConnectionError, match="default connection 'nope'"):
        QueueManager({"primary": primary}, "nope", registry, Container())


def test_dispatch_many(manager: QueueManager, memory: MemoryQueue) -> None:
    ids = manager.dispatch_many([jobs.Record(i) for i in range(5)])
    assert len(ids) == 5 and all(ids)
    assert [j.id for j in memory.jobs] == ids


def test_dispatch_now_runs_inline_with_retries_and_raises(manager: QueueManager, memory: MemoryQueue) -> None:
    manager.dispatch_now(jobs.Record("now"))
    assert jobs.calls == [("record", "now")]
    with pytest.raises(RuntimeError, match="attempt 3 failed"):
        manager.dispatch_now(jobs.Flaky())
    assert [c for c in jobs.calls if c[0] == "flaky"] == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert len(jobs.Flaky.failed_calls) == 1
    assert memory.size() == 0


def test_instance_and_module_dispatch(manager: QueueManager, memory: MemoryQueue) -> None:
    with pytest.raises(NoQueueConfiguredError, match="set_instance"):
        rainier_sync.instance()
    assert rainier_sync.set_instance(manager) is None
    assert rainier_sync.instance() is manager
    rainier_sync.dispatch(jobs.Record("global"))
    assert memory.size() == 1


def test_a_manager_with_no_connection_says_so() -> None:
    with pytest.raises(NoQueueConfiguredError, match="no queue is configured"):
        QueueManager().dispatch(jobs.Record())


def test_sync_runs_inline_and_raises_to_the_dispatcher(registry: Any) -> None:
    sync = SyncQueue()
    manager = QueueManager({"sync": sync}, registry=registry, container=Container())
    manager.dispatch(jobs.Record("inline"))
    assert jobs.calls == [("record", "inline")]
    with freeze_time("2026-01-01") as frozen:
        with pytest.raises(RuntimeError, match="attempt 3 failed") as raised:
            manager.dispatch(jobs.Flaky())
        assert frozen.time_to_freeze.year == 2026
    assert isinstance(raised.value.__cause__, OSError)
    assert [c for c in jobs.calls if c[0] == "flaky"] == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert len(jobs.Flaky.failed_calls) == 1
    assert sync.failed_jobs()[0].error == "RuntimeError: attempt 3 failed"
    manager.dispatch(jobs.Flaky(succeed_on=2))
    assert jobs.calls[-2:] == [("flaky", 1), ("flaky", 2)]


def test_queue_driver_answers_as_the_design_table_does() -> None:
    from rainier_sync import QueueDriver as D

    assert [d.is_deferred() for d in D] == [False, True, True, True, True, True]
    assert [d.needs_a_worker() for d in D] == [False, True, True, True, True, True]
    assert [d.survives_a_restart() for d in D] == [False, False, True, True, True, True]
    assert [d for d in D if d.may_lose_an_accepted_job()] == [D.REDIS]
    assert D.parse(" Redis ") is D.REDIS
    with pytest.raises(ValueError, match="unknown queue driver 'rabbit'"):
        D.parse("rabbit")


def test_a_job_dispatching_receiver_adds_meta_that_travels_with_the_job() -> None:
    from rainier_sync import signals

    memory = MemoryQueue()
    registry = JobRegistry()
    registry.register(Meta)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())

    def trace(sender: Any, jobs: list[Any], connection: str) -> None:
        for job in jobs:
            job.meta = {**(job.meta or {}), "trace": f"t-{connection}"}

    with signals.job_dispatching.connected_to(trace):
        manager.dispatch(Meta())
        manager.dispatch_many([Meta(), Meta()])
    [first, *_] = memory.reserve_many(["default"], 3)
    assert first.meta == {"trace": "t-m"}
    assert all(job.meta == {"trace": "t-m"} for job in memory.reserve_many(["default"], 3))
    assert QueuedJob.decode(first.encode()).meta == {"trace": "t-m"}


@dataclass
class Meta(Job):
    NAME = "manager.meta"

    def handle(self, context: JobContext) -> None:
        pass


# -- the default lock store: the default connection's own backend ------------------------------

OWN_STORES = ["memory", "sqlite", "postgres", "mysql", "redis"]


@dataclass
class Counted(Job):
    """Says when it ran, through an event of its test's."""

    NAME = "tests.manager.counted"
    ran: ClassVar[dict[str, threading.Event]] = {}

    tag: str = ""

    def handle(self, context: JobContext) -> None:
        self.ran[self.tag].set()


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``check`` (a state kept in a backend, which no event announces) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never came true"
        time.sleep(0.02)


@pytest.fixture(params=OWN_STORES)
def own_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], BaseQueue]]:
    """Makes drivers on one fresh place of a backend that can hold a lock store (each call a new driver there)."""
    kind = request.param
    made: list[BaseQueue] = []
    if kind == "memory":
        memory = MemoryQueue(reservation=30)
        yield lambda: memory
        return
    if kind == "redis":
        from rainier_sync.drivers import RedisQueue

        url = request.getfixturevalue("redis_url")
        prefix = f"rstest:{uuid.uuid4().hex[:12]}:queue:"

        def make_redis() -> BaseQueue:
            made.append(RedisQueue.from_url(url, prefix=prefix, reservation=30))
            return made[-1]

        yield make_redis
        client = redis_client(url)
        for key in list(client.scan_iter(match=prefix.removesuffix("queue:") + "*", count=1000)):
            client.delete(key)
        client.close()
    else:
        from rainier_sync.drivers.database import DatabaseQueue
        from tests.drivers.database.support import mysql_database_url, postgres_schema_url

        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'jobs.db'}"
        elif kind == "postgres":
            url = postgres_schema_url(request)
        else:
            url = mysql_database_url(request)

        def make_database() -> BaseQueue:
            made.append(DatabaseQueue.from_url(url, reservation=30))
            return made[-1]

        first = make_database()
        first.migrate()  # the queue's migrations: its lock tables with them
        yield make_database
    for driver in made:
        driver.close()


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def test_a_manager_given_no_locks_keeps_its_coordination_in_the_default_connections_backend(
    own_backend: Callable[[], BaseQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rainier_sync import Worker, WorkerOptions, fleet
    from rainier_sync.worker import loop

    monkeypatch.setattr(fleet, "RECORD_EVERY", 0.05)
    monkeypatch.setattr(loop, "RECORD_EVERY", 0.05)
    name = f"main-{uuid.uuid4().hex[:8]}"  # a connection (and queue) no other test records workers under
    queue = f"q-{uuid.uuid4().hex[:8]}"
    registry = JobRegistry().with_job(Counted)
    manager = QueueManager({name: own_backend()}, registry=registry)
    assert manager.locks is not None, "the default connection's backend holds the store"
    # A second manager, as another process would build it, over the same backend.
    other = QueueManager({name: own_backend()}, registry=registry)
    worker = Worker(manager, options=WorkerOptions(queues=[queue], sleep=0.05))
    worker.start()
    try:
        assert worker.fleet is not None

        def listed() -> bool:
            return [w.id for w in other.workers()] == [worker.fleet.id] if worker.fleet else False

        eventually(listed)
        (info,) = manager.workers(name)
        assert (info.connection, info.queues) == (name, (queue,))

        manager.pause(queue)
        assert other.paused() == {queue}, "paused in the backend every manager over it reads"
        other.resume(queue)
        assert manager.paused() == set()

        tags = [uuid.uuid4().hex for _ in range(3)]
        for tag in tags:
            Counted.ran[tag] = threading.Event()
        batch = manager.batch([Counted(tag) for tag in tags]).on_queue(queue).dispatch()
        for tag in tags:
            assert Counted.ran[tag].wait(30), "the worker ran the batch's jobs"

        def finished() -> bool:
            found = other.find_batch(batch.id)
            return found is not None and found.finished

        eventually(finished)
        found = manager.find_batch(batch.id)
        assert found is not None and (found.total, found.processed, found.failed) == (3, 3, 0)
    finally:
        worker.stop()
        worker.join(10)


def sqs_driver(endpoint: str) -> BaseQueue:
    from rainier_sync.drivers.sqs import SqsQueue
    from tests.services.moto import REGION, sqs_client_for, unique_queue_name

    client = sqs_client_for(endpoint)
    url, failed = (client.create_queue(QueueName=unique_queue_name(n))["QueueUrl"] for n in ("default", "failed"))
    return SqsQueue(
        url, failed_queue_url=failed, endpoint=endpoint, region=REGION, key="testing", secret="testing", wait_time=1
    )


def assert_everything_needing_a_store_names_locks(manager: QueueManager, why: str) -> None:
    """Every feature kept in a lock store raises naming ``locks=``; none answers empty."""
    Counted.ran["never"] = threading.Event()
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("workers", manager.workers),
        ("throughput", manager.throughput),
        ("pause", lambda: manager.pause("default")),
        ("resume", lambda: manager.resume("default")),
        ("batch", lambda: manager.batch([Counted("never")]).dispatch()),
        ("batches", manager.batches),
        ("find_batch", lambda: manager.find_batch("nope")),
        ("chain", lambda: manager.chain([Counted("never")]).dispatch()),
        ("result", lambda: manager.result("nope")),
    ]
    for what, attempt in attempts:
        with pytest.raises(rainier_sync.ConfigurationError, match="locks=") as raised:
            attempt()
        assert why in str(raised.value), what
    assert manager.paused() == set(), "no queue can be paused without a store"


def test_on_sqs_a_manager_given_no_locks_has_no_store_and_says_so_naming_locks(sqs_endpoint: str) -> None:
    driver = sqs_driver(sqs_endpoint)
    manager = QueueManager({"jobs": driver}, registry=JobRegistry().with_job(Counted))
    try:
        assert manager.locks is None
        assert_everything_needing_a_store_names_locks(manager, "connection 'jobs' (sqs) has no backend")
        assert driver.size("default") == 0, "a batch or chain refused stored nothing"
    finally:
        manager.close()


def test_locks_none_says_no_store_on_a_backend_that_could_hold_one() -> None:
    manager = QueueManager({"main": MemoryQueue()}, registry=JobRegistry().with_job(Counted), locks=None)
    assert manager.locks is None
    assert_everything_needing_a_store_names_locks(manager, "given locks=None")


def test_an_explicit_store_wins_over_the_backends_own() -> None:
    from rainier_sync.locks import MemoryLockStore

    store = MemoryLockStore()
    assert QueueManager({"main": MemoryQueue()}, locks=store).locks is store


def test_a_store_comes_from_the_default_connection_only(sqs_endpoint: str) -> None:
    from rainier_sync.locks import MemoryLockStore

    memory = MemoryQueue()
    on_sqs = QueueManager({"memory": memory, "sqs": sqs_driver(sqs_endpoint)}, default="sqs")
    assert on_sqs.locks is None
    on_memory = QueueManager({"memory": memory, "sqs": sqs_driver(sqs_endpoint)}, default="memory")
    assert isinstance(on_memory.locks, MemoryLockStore)
    assert QueueManager({"memory": memory}).locks is on_memory.locks, "one store per memory queue"
    on_sqs.close()
    on_memory.close()


def test_sync_has_no_store_and_a_unique_job_is_dispatched_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    registry = JobRegistry().with_job(jobs.Unique)
    manager = QueueManager({"now": SyncQueue()}, registry=registry, container=Container())
    assert manager.locks is None
    with caplog.at_level("WARNING", logger="rainier_sync"):
        assert manager.dispatch(jobs.Unique("a")) is not None
        assert manager.dispatch(jobs.Unique("a")) is not None
    assert sum("no lock store is configured" in r.getMessage() for r in caplog.records) == 2


def test_a_unique_job_takes_its_lock_in_the_default_store(memory: MemoryQueue) -> None:
    manager = QueueManager({"main": memory}, registry=JobRegistry().with_job(jobs.Unique))
    first = manager.dispatch(jobs.Unique("a"))
    assert first is not None
    assert manager.dispatch(jobs.Unique("a")) is None, "the copy is dropped: the lock is held in the memory store"
    assert [job.id for job in memory.jobs] == [first]


def test_on_kafka_a_manager_given_no_locks_uses_the_queues_lease_store(kafka_brokers: str) -> None:
    from rainier_sync import Worker, WorkerOptions
    from rainier_sync.drivers.kafka import KafkaQueue
    from rainier_sync.locks import MemoryLockStore
    from tests.services.tansu import FAST_GROUP

    leases = MemoryLockStore()
    tag = uuid.uuid4().hex[:10]

    def make() -> KafkaQueue:
        return KafkaQueue(
            kafka_brokers, group=f"m-{tag}", topic_prefix=f"m-{tag}.", lease=5, locks=leases,
            consumer_config=FAST_GROUP,
        )  # fmt: skip

    registry = JobRegistry().with_job(Counted)
    manager = QueueManager({"stream": make()}, registry=registry)
    assert manager.locks is leases, "the store every worker already shares for its leases"
    worker = Worker(manager, options=WorkerOptions(queues=["default"], sleep=0.1))
    worker.start()
    try:
        assert worker.fleet is not None
        eventually(lambda: [w.id for w in manager.workers()] == [getattr(worker.fleet, "id", None)])
        manager.pause("default")
        assert manager.paused() == {"default"}
        manager.resume("default")
        Counted.ran[tag] = threading.Event()
        batch = manager.batch([Counted(tag)]).dispatch()
        assert Counted.ran[tag].wait(60)
        eventually(lambda: getattr(manager.find_batch(batch.id), "finished", False), timeout=60)
    finally:
        worker.stop()
        worker.join(15)
        manager.close()
    unstored = QueueManager({"stream": make()}, registry=registry, locks=None)
    try:
        assert_everything_needing_a_store_names_locks(unstored, "given locks=None")
    finally:
        unstored.close()
