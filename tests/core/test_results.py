"""Job results (``KEEP_RESULT``) on the memory driver and store: kept, waited
for, failed, expired, refused when not JSON, and across a timeout child."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.errors import ConfigurationError, JobDefinitionError
from rainier_sync.locks import MemoryLockStore
from rainier_sync.types import Result


@dataclass
class Sum(Job):
    NAME = "results.sum"
    KEEP_RESULT = 60

    a: int = 0
    b: int = 0

    def handle(self, context: JobContext) -> Any:
        if self.a < 0:
            raise ValueError("negative")
        return {"sum": self.a + self.b}


@dataclass
class Timed(Sum):
    NAME = "results.timed"
    TIMEOUT = 10


@dataclass
class Odd(Job):
    NAME = "results.odd"
    KEEP_RESULT = 60

    def handle(self, context: JobContext) -> Any:
        return {1, 2}


@dataclass
class Gate(Job):
    NAME = "results.gate"
    KEEP_RESULT = 60
    open: ClassVar[threading.Event] = threading.Event()

    def handle(self, context: JobContext) -> Any:
        assert Gate.open.wait(10)
        return "through"


def build() -> tuple[QueueManager, MemoryQueue]:
    memory = MemoryQueue()
    registry = JobRegistry().with_job(Sum).with_job(Timed).with_job(Odd).with_job(Gate)
    return QueueManager({"m": memory}, registry=registry, container=Container(), locks=MemoryLockStore()), memory


def once(manager: QueueManager) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()


def test_a_result_is_pending_then_processed_with_the_value() -> None:
    manager, _ = build()
    job_id = manager.dispatch(Sum(2, 3))
    assert job_id is not None
    assert manager.result(job_id) == Result("pending")
    once(manager)
    assert manager.result(job_id) == Result("processed", {"sum": 5})
    assert manager.result("no-such-job") == Result("unknown")


def test_a_failed_job_reports_its_error() -> None:
    manager, _ = build()
    job_id = manager.dispatch(Sum(-1, 0))
    assert job_id is not None
    once(manager)
    got = manager.result(job_id)
    assert got.status == "failed" and got.error is not None and "negative" in got.error


def test_a_result_that_is_not_json_fails_the_attempt_naming_its_type() -> None:
    manager, memory = build()
    job_id = manager.dispatch(Odd())
    assert job_id is not None
    once(manager)
    got = manager.result(job_id)
    assert got.status == "failed" and "Odd.handle returned a set, which is not JSON" in (got.error or "")
    assert len(memory.failed) == 1


def test_waiting_returns_when_the_job_finishes() -> None:
    manager, _ = build()
    Gate.open.clear()
    job_id = manager.dispatch(Gate())
    assert job_id is not None
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05))
    worker.start()
    try:
        assert manager.result(job_id, wait=0.05).status == "pending"
        threading.Timer(0.1, Gate.open.set).start()
        assert manager.result(job_id, wait=10) == Result("processed", "through")
    finally:
        worker.stop()
        worker.join(10)


def test_a_timed_job_keeps_its_result_from_its_child() -> None:
    manager, _ = build()
    job_id = manager.dispatch(Timed(4, 4))
    assert job_id is not None
    once(manager)
    assert manager.result(job_id) == Result("processed", {"sum": 8})


def test_results_expire() -> None:
    manager, _ = build()
    with freeze_time("2026-03-01 12:00:00") as clock:
        job_id = manager.dispatch(Sum(1, 1))
        assert job_id is not None
        once(manager)
        assert manager.result(job_id).status == "processed"
        clock.tick(61)
        assert manager.result(job_id) == Result("unknown")


@pytest.mark.parametrize("keep", [0, -5, True, "60"])
def test_a_bad_keep_result_is_refused_at_registration_naming_it(keep: Any) -> None:
    class Bad(Sum):
        NAME = "results.bad"
        KEEP_RESULT = keep

    with pytest.raises(JobDefinitionError, match="KEEP_RESULT"):
        JobRegistry().register(Bad)


def test_keeping_results_needs_a_lock_store() -> None:
    registry = JobRegistry().with_job(Sum)
    memory = MemoryQueue()
    manager = QueueManager({"m": memory}, registry=registry, container=Container(), locks=None)
    with pytest.raises(ConfigurationError, match="KEEP_RESULT"):
        manager.dispatch(Sum(1, 2))
    assert memory.size() == 0, "refused before anything is stored"
    with pytest.raises(ConfigurationError, match="locks="):
        Worker(manager, options=WorkerOptions(once=True))


def test_a_job_finished_before_dispatch_returns_keeps_its_result() -> None:
    from rainier_sync.drivers import SyncQueue

    registry = JobRegistry().with_job(Sum)
    manager = QueueManager({"s": SyncQueue()}, registry=registry, container=Container(), locks=MemoryLockStore())
    job_id = manager.dispatch(Sum(20, 22))  # runs inline, inside the push
    assert job_id is not None
    assert manager.result(job_id) == Result("processed", {"sum": 42})


def test_a_failed_push_takes_the_pending_mark_back() -> None:
    class Refusing(MemoryQueue):
        def push(self, job: Any) -> str:
            raise ConnectionError("the backend is down")

    registry = JobRegistry().with_job(Sum)
    locks = MemoryLockStore()
    manager = QueueManager({"m": Refusing()}, registry=registry, container=Container(), locks=locks)
    with pytest.raises(ConnectionError):
        manager.dispatch(Sum(1, 1))
    assert not any(value.startswith('{"status":"pending"') for value, _ in locks._values.values())
