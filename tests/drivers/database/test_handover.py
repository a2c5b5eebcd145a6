"""The database driver's hand-over: a chain's next link (or catch job) stored in
the transaction that acknowledges (or fails) the link before it, on SQLite,
PostgreSQL and MariaDB, against the real servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.locks import MemoryLockStore
from rainier_sync.types import ExceptionInfo, QueuedJob


@dataclass
class Step(Job):
    NAME = "dbtest.handover.step"
    TRIES = 1

    n: int = 0
    fail: bool = False
    ran: ClassVar[list[int]] = []

    def handle(self, context: JobContext) -> None:
        Step.ran.append(self.n)
        if self.fail:
            raise RuntimeError(f"step {self.n} broke")


def setup(url: str) -> tuple[DatabaseQueue, QueueManager]:
    queue = DatabaseQueue.from_url(url, reservation=30)
    registry = JobRegistry().with_job(Step)
    manager = QueueManager({"db": queue}, registry=registry, container=Container(), locks=MemoryLockStore())
    return queue, manager


def claimed(queue: DatabaseQueue, manager: QueueManager, n: int) -> QueuedJob:
    queue.push(manager.build(Step(n)))
    job = queue.reserve("default")
    assert job is not None
    return job


def ids(queue: DatabaseQueue) -> list[str]:
    return sorted(str(row[0]) for row in queue._backend.query("SELECT id FROM rainier_jobs"))


def test_acknowledging_a_link_stores_what_it_hands_over_once(db_url: str) -> None:
    queue, manager = setup(db_url)
    try:
        link, after = claimed(queue, manager, 1), manager.build(Step(2))
        queue.acknowledge_handing_over(link, [after])
        assert ids(queue) == [after.id], "the link gone, its next link stored"
        queue.acknowledge_handing_over(link, [after])
        assert ids(queue) == [after.id], "sent again (its commit's reply lost, say): nothing stored twice"
        again = queue.reserve("default")
        assert again is not None and again.id == after.id and again.payload == {"n": 2, "fail": False}
    finally:
        queue.close()


def test_a_link_whose_reservation_was_claimed_again_hands_nothing_over(db_url: str) -> None:
    queue, manager = setup(db_url)
    try:
        with freeze_time("2026-03-01 12:00:00") as clock:
            first = claimed(queue, manager, 1)
            clock.tick(31)
            assert queue.reclaim_expired() == 1
            second = queue.reserve("default")  # another worker now runs the same link
            assert second is not None and second.id == first.id
            after = manager.build(Step(2))
            queue.acknowledge_handing_over(first, [after])
            assert ids(queue) == [first.id], "the run that holds the link hands over, not the one that lost it"
            queue.acknowledge_handing_over(second, [after])
            assert ids(queue) == [after.id]
    finally:
        queue.close()


def test_failing_a_link_stores_its_catch_job_in_the_same_transaction(db_url: str) -> None:
    queue, manager = setup(db_url)
    try:
        link, catch = claimed(queue, manager, 1), manager.build(Step(99))
        queue.fail_handing_over(link, ExceptionInfo.from_message("RuntimeError: broke"), [catch])
        assert ids(queue) == [catch.id]
        assert [failed.id for failed in queue.failed_jobs()] == [link.id]
        queue.fail_handing_over(link, ExceptionInfo.from_message("RuntimeError: broke"), [catch])
        assert ids(queue) == [catch.id], "failed once, its catch job stored once"
    finally:
        queue.close()


def test_a_hand_over_that_cannot_be_stored_leaves_the_link_held(db_url: str) -> None:
    queue, manager = setup(db_url)
    try:
        link, after = claimed(queue, manager, 1), manager.build(Step(2))
        broken = manager.build(Step(3))
        broken.payload, broken.payload_json = {"n": object()}, None  # cannot be encoded: stops half-way
        with pytest.raises(TypeError):
            queue.acknowledge_handing_over(link, [after, broken])
        assert ids(queue) == [link.id], "neither the acknowledgement nor the first insert happened"
        queue.acknowledge_handing_over(link, [after])
        assert ids(queue) == [after.id]
    finally:
        queue.close()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue({"sqlite": "sqlite_url", "postgres": "pg_url"}[request.param]))


@pytest.mark.parametrize("breaks", [False, True], ids=["succeeds", "breaks"])
def test_a_worker_hands_over_in_the_acknowledging_transaction(url: str, breaks: bool) -> None:
    """Links bound for the worker's own connection carry no once-key and take none:
    each is stored exactly once, by the transaction that settles the link before it.
    The catch job keeps its key (a retried link that fails again hands it over again)."""
    Step.ran.clear()
    queue, manager = setup(url)
    locks = manager.locks
    assert locks is not None
    try:
        chain_id = manager.chain([Step(1), Step(2, fail=breaks), Step(3)]).catch(Step(99)).dispatch()
        Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()
        assert Step.ran == ([1, 2, 99] if breaks else [1, 2, 3])
        assert locks.owner(f"chain:{chain_id}:0") is not None, "the first link, dispatched, is guarded"
        for step in ("1", "2"):
            assert locks.owner(f"chain:{chain_id}:{step}") is None, f"step {step} was handed over in a transaction"
        assert (locks.owner(f"chain:{chain_id}:catch") is not None) == breaks, "the catch job took its key"
        assert queue.size() == 0
    finally:
        queue.close()


def test_a_link_bound_for_another_connection_is_handed_over_idempotently(sqlite_url: str) -> None:
    Step.ran.clear()
    queue = DatabaseQueue.from_url(sqlite_url)
    memory = MemoryQueue()
    locks = MemoryLockStore()
    registry = JobRegistry().with_job(Step)
    manager = QueueManager({"db": queue, "mem": memory}, default="db", registry=registry, locks=locks)
    try:
        chain_id = manager.chain([Step(1), manager.pending(Step(2)).on_connection("mem"), Step(3)]).dispatch()
        Worker(manager, options=WorkerOptions(once=True), connection="db").run()
        assert Step.ran == [1] and memory.size() == 1 and queue.size() == 0
        Worker(manager, options=WorkerOptions(once=True), connection="mem").run()
        Worker(manager, options=WorkerOptions(once=True), connection="db").run()
        assert Step.ran == [1, 2, 3]
        assert locks.owner(f"chain:{chain_id}:1") is not None, "queued before the acknowledgement, guarded by its key"
        assert locks.owner(f"chain:{chain_id}:2") is not None, "memory's worker hands over idempotently too"
    finally:
        queue.close()
