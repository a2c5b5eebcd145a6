"""Batches on the memory driver: exact counts when a job runs twice, callbacks
once, cancelling (by a failure and by hand), adding from a job, the fake, and
bad input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue, SyncQueue
from rainier_sync.errors import ConfigurationError
from rainier_sync.execution import Executor
from rainier_sync.locks import MemoryLockStore


@dataclass
class Row(Job):
    NAME = "batch.row"

    n: int = 0
    fail: bool = False
    ran: ClassVar[list[int]] = []

    def handle(self, context: JobContext) -> None:
        Row.ran.append(self.n)
        if self.fail:
            raise RuntimeError(f"row {self.n} is bad")


@dataclass
class Retried(Row):
    NAME = "batch.retried"
    TRIES = 3


@dataclass
class Fanout(Job):
    NAME = "batch.fanout"

    def handle(self, context: JobContext) -> None:
        batch = context.batch
        assert batch is not None and not batch.cancelled
        batch.add([Row(100), Row(101)])


@dataclass
class Callback(Job):
    NAME = "batch.callback"

    which: str = ""
    heard: ClassVar[list[str]] = []

    def handle(self, context: JobContext) -> None:
        Callback.heard.append(self.which)


@pytest.fixture(autouse=True)
def _clean() -> None:
    Row.ran.clear()
    Callback.heard.clear()


def build() -> tuple[QueueManager, MemoryQueue]:
    memory = MemoryQueue()
    registry = JobRegistry().with_job(Row).with_job(Retried).with_job(Fanout).with_job(Callback)
    return QueueManager({"m": memory}, registry=registry, container=Container(), locks=MemoryLockStore()), memory


def drain(manager: QueueManager, concurrency: int = 4) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, concurrency=concurrency)).run()


def callbacks(pending: Any) -> Any:
    return pending.then(Callback("then")).catch(Callback("catch")).finally_(Callback("finally"))


def test_a_batch_counts_every_job_and_runs_then_and_finally_once() -> None:
    manager, _ = build()
    batch = callbacks(manager.batch([Row(n) for n in range(50)], name="import 42")).dispatch()
    assert (batch.name, batch.total, batch.pending, batch.finished) == ("import 42", 50, 50, False)
    drain(manager)
    done = manager.find_batch(batch.id)
    assert done is not None
    assert (done.total, done.pending, done.processed, done.failed, done.finished) == (50, 0, 50, 0, True)
    assert sorted(Callback.heard) == ["finally", "then"]


def test_a_job_run_twice_counts_once() -> None:
    manager, memory = build()
    batch = callbacks(manager.batch([Retried(1), Retried(2)])).dispatch()
    [first] = memory.reserve_many(["default"], 1)
    Executor(manager.registry, manager.container, locks=manager.locks, dispatcher=manager).run(first)
    memory.release(first, 0)  # ran and counted; its acknowledgement never happened
    drain(manager)
    done = manager.find_batch(batch.id)
    assert done is not None and (done.processed, done.pending) == (2, 0)
    assert sorted(Row.ran) == [1, 1, 2]
    assert sorted(Callback.heard) == ["finally", "then"]


def test_a_failure_cancels_the_batch_runs_catch_once_and_skips_the_rest() -> None:
    manager, _ = build()
    batch = callbacks(manager.batch([Row(1, fail=True), *[Row(n) for n in range(2, 6)]])).dispatch()
    drain(manager, concurrency=1)
    done = manager.find_batch(batch.id)
    assert done is not None and done.cancelled and done.finished
    assert (done.failed, done.processed + done.skipped) == (1, 4) and done.skipped >= 1
    assert sorted(Callback.heard) == ["catch", "finally"], "then needs every job to succeed"


def test_allow_failures_goes_on_after_a_failure() -> None:
    manager, _ = build()
    batch = callbacks(manager.batch([Row(1, fail=True), Row(2), Row(3)]).allow_failures()).dispatch()
    drain(manager, concurrency=1)
    done = manager.find_batch(batch.id)
    assert done is not None and not done.cancelled
    assert (done.failed, done.processed, done.pending) == (1, 2, 0)
    assert sorted(Callback.heard) == ["catch", "finally"]


def test_cancel_batch_skips_jobs_not_yet_started() -> None:
    manager, memory = build()
    batch = manager.batch([Row(n) for n in range(10)]).finally_(Callback("finally")).dispatch()
    assert manager.cancel_batch(batch.id)
    stats = drain(manager)
    assert Row.ran == [] and stats.skipped == 10
    done = manager.find_batch(batch.id)
    assert done is not None and (done.skipped, done.finished, done.cancelled) == (10, True, True)
    assert Callback.heard == ["finally"]
    assert not manager.cancel_batch("no-such-batch")


def test_a_job_adds_to_its_own_batch() -> None:
    manager, _ = build()
    batch = manager.batch([Fanout()]).then(Callback("then")).dispatch()
    drain(manager)
    done = manager.find_batch(batch.id)
    assert done is not None and (done.total, done.processed, done.pending) == (3, 3, 0)
    assert sorted(Row.ran) == [100, 101] and Callback.heard == ["then"]


class CountingStore(MemoryLockStore):
    """Says how a batch's jobs were counted: the items of each round, and what was
    acknowledged by the time each round was counted; ``broken`` rounds fail."""

    def __init__(self, memory: MemoryQueue) -> None:
        super().__init__()
        self.memory = memory
        self.rounds: list[int] = []
        self.held_then: list[int] = []
        self.single = 0
        self.broken = 0

    def tally_settle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        self.single += 1
        return super().tally_settle(key, member, field, ttl)

    def tally_settle_many(self, items: Any) -> list[tuple[dict[str, int], bool]]:
        if self.broken:
            self.broken -= 1
            raise ConnectionError("the lock store is out of reach")
        self.rounds.append(len(items))
        self.held_then.append(self.memory.counts("default").reserved)
        return super().tally_settle_many(items)


def claims_of(manager: QueueManager, reported: list[str]) -> Any:
    """A worker's claims, fed by hand: finished attempts as its pool threads leave them."""
    worker = Worker(manager, options=WorkerOptions(once=True))
    from rainier_sync.worker.settle import Claims

    return worker, Claims(
        worker._session, worker.executor, worker.stats, report=lambda what, exc: reported.append(what),
        stop=worker.stop, stopping=lambda: False,
    )  # fmt: skip


def test_a_worker_counts_a_round_of_finished_jobs_at_once_before_acknowledging_them() -> None:
    memory = MemoryQueue()
    store = CountingStore(memory)
    registry = JobRegistry().with_job(Row).with_job(Callback)
    manager = QueueManager({"m": memory}, registry=registry, container=Container(), locks=store)
    batch = callbacks(manager.batch([Row(n, fail=n == 3) for n in range(10)]).allow_failures()).dispatch()
    reported: list[str] = []
    worker, claims = claims_of(manager, reported)
    jobs = memory.reserve_many(["default"], 10)
    claims.claimed(jobs)
    # Given ten attempts finished by pool threads (one a final failure)
    for job in jobs:
        completion = worker.executor.run(job)
        assert completion.batch in ("processed", "failed"), "left for the owning loop to count"
        claims.done.append(completion)
    assert store.rounds == [] and store.tally(f"batch:{batch.id}")["pending"] == 10
    # When the owning loop settles them
    assert claims.settle(0.0)
    # Then they were counted in one round trip, while all ten were still held, and only then settled
    assert store.rounds == [10] and store.held_then == [10] and store.single == 0
    assert memory.counts("default").reserved == 0 and len(memory.failed) == 1
    done = manager.find_batch(batch.id)
    assert done is not None and (done.processed, done.failed, done.pending) == (9, 1, 0)
    assert memory.size("default") == 2, "catch and finally queued, once each"
    assert reported == []


def test_a_round_the_store_could_not_count_is_kept_and_counted_once_later() -> None:
    memory = MemoryQueue()
    store = CountingStore(memory)
    manager = QueueManager({"m": memory}, registry=JobRegistry().with_job(Row).with_job(Callback), locks=store)
    batch = manager.batch([Row(n) for n in range(4)]).then(Callback("then")).dispatch()
    reported: list[str] = []
    worker, claims = claims_of(manager, reported)
    jobs = memory.reserve_many(["default"], 4)
    claims.claimed(jobs)
    claims.done.extend(worker.executor.run(job) for job in jobs)
    store.broken = 1
    assert not claims.settle(0.0), "the store failed: nothing is acknowledged uncounted"
    assert reported == ["batch"] and memory.counts("default").reserved == 4 and len(claims.unsettled) == 4
    assert claims.settle(0.0)
    assert store.rounds == [4] and memory.size("default") == 1, "counted once, then acknowledged; then queued"
    done = manager.find_batch(batch.id)
    assert done is not None and (done.processed, done.pending) == (4, 0)


@pytest.mark.parametrize("path", ["sync", "drain"])
def test_jobs_of_a_batch_run_outside_a_worker_are_counted_as_they_finish(path: str) -> None:
    """The sync driver runs each job inside its dispatch (as ``dispatch_now`` does),
    ``MemoryQueue.drain()`` one after another: each counts as it finishes."""
    memory = MemoryQueue()
    driver: Any = SyncQueue() if path == "sync" else memory
    registry = JobRegistry().with_job(Row).with_job(Callback)
    manager = QueueManager({"m": driver}, registry=registry, container=Container(), locks=MemoryLockStore())
    batch = manager.batch([Row(1), Row(2), Row(3)]).then(Callback("then")).finally_(Callback("finally")).dispatch()
    if path == "drain":
        memory.drain()
    done = manager.find_batch(batch.id)
    assert done is not None and (done.total, done.processed, done.pending) == (3, 3, 0)
    assert sorted(Callback.heard) == ["finally", "then"]


def test_batches_are_listed_newest_first() -> None:
    from freezegun import freeze_time

    manager, _ = build()
    with freeze_time("2026-03-01 12:00:00") as clock:
        first = manager.batch([Row(1)], name="first").dispatch()
        clock.tick(1)
        second = manager.batch([Row(2)], name="second").keep_for(60).dispatch()
        assert [b.id for b in manager.batches()] == [second.id, first.id]
        clock.tick(61)
        assert [b.id for b in manager.batches()] == [first.id], "an expired batch leaves the list"


def test_on_queue_puts_the_jobs_on_that_queue() -> None:
    manager, memory = build()
    manager.batch([Row(1), Row(2)]).on_queue("imports").dispatch()
    assert memory.size("imports") == 2 and memory.size("default") == 0


def test_the_fake_records_batches() -> None:
    fake = QueueManager.fake()
    fake.batch([Row(1), Row(2)], name="nightly").then(Callback("then")).dispatch()
    fake.assert_batched(lambda b: len(b.jobs) == 2)
    with pytest.raises(AssertionError, match="matching batch"):
        fake.assert_batched(lambda b: len(b.jobs) == 3)
    fake.assert_nothing_pushed()


@pytest.mark.parametrize(
    ("jobs", "error", "said"),
    [
        ([], ValueError, "at least one job"),
        ([Row(1), "row"], TypeError, "job 1 of the batch"),
        (Row(1), TypeError, "a list of jobs"),
    ],
)
def test_bad_batches_are_refused_naming_the_fault(jobs: Any, error: type[Exception], said: str) -> None:
    manager, _ = build()
    with pytest.raises(error, match=said):
        manager.batch(jobs)


def test_an_unregistered_job_and_a_missing_lock_store_are_refused() -> None:
    @dataclass
    class Stray(Job):
        NAME = "batch.stray"

        def handle(self, context: JobContext) -> None:
            pass

    manager, _ = build()
    with pytest.raises(ConfigurationError, match="job 1 of the batch: job 'batch.stray' is not registered"):
        manager.batch([Row(1), Stray()])
    with pytest.raises(ConfigurationError, match="then: job 'batch.stray' is not registered"):
        manager.batch([Row(1)]).then(Stray())
    unlocked = QueueManager(
        {"m": MemoryQueue()}, registry=JobRegistry().with_job(Row), container=Container(), locks=None
    )
    with pytest.raises(ConfigurationError, match="locks="):
        unlocked.batch([Row(1)]).dispatch()


class SkipAll:
    def handle(self, job: Job, context: JobContext, call_next: Any) -> None:
        context.skip("not today")


@dataclass
class Skipped(Job):
    NAME = "batch.skipped"

    def handle(self, context: JobContext) -> None:
        raise AssertionError("skipped by its middleware, never run")

    def middleware(self) -> list[Any]:
        return [SkipAll()]


def test_a_job_of_a_batch_its_middleware_skips_counts_as_skipped() -> None:
    memory = MemoryQueue()
    registry = JobRegistry().with_job(Skipped).with_job(Callback)
    manager = QueueManager({"m": memory}, registry=registry, container=Container(), locks=MemoryLockStore())
    batch = callbacks(manager.batch([Skipped(), Skipped()])).dispatch()
    stats = drain(manager)
    done = manager.find_batch(batch.id)
    assert done is not None and (done.skipped, done.pending, done.finished) == (2, 0, True)
    assert stats.skipped == 2 and Callback.heard == ["finally"], "then needs every job to succeed"
