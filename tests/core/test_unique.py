from __future__ import annotations

import logging
from typing import Any

import pytest
from freezegun import freeze_time

from rainier_sync import Container, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.execution import Outcome

from . import jobs


def run_once(manager: QueueManager) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()


def test_a_duplicate_is_dropped_and_returns_none(manager: QueueManager, memory: MemoryQueue) -> None:
    assert manager.dispatch(jobs.Unique("a")) is not None
    assert manager.dispatch(jobs.Unique("a")) is None
    assert manager.dispatch(jobs.Unique("b")) is not None
    assert memory.size() == 2


def test_the_lock_key_is_name_and_id(manager: QueueManager, registry: Any) -> None:
    from dataclasses import dataclass

    @dataclass
    class OtherUnique(jobs.Unique):
        NAME = "tests.other-unique"

    registry.register(OtherUnique)
    assert manager.dispatch(jobs.Unique("7")) is not None
    assert manager.dispatch(OtherUnique("7")) is not None, "same id, different NAME: not the same lock"


def test_released_on_success(manager: QueueManager) -> None:
    manager.dispatch(jobs.Unique("a"))
    run_once(manager)
    assert manager.dispatch(jobs.Unique("a")) is not None


def test_kept_while_released_for_retry_and_released_on_final_failure(manager: QueueManager,
                                                                     memory: MemoryQueue) -> None:
    manager.dispatch(jobs.Unique("a", fail=True))  # TRIES=2, no backoff
    worker = Worker(manager)
    first = memory.reserve(["default"])
    assert first is not None
    completion = worker.executor.run(first)
    assert completion.outcome is Outcome.RELEASED
    worker.executor.apply(memory, completion)
    assert manager.dispatch(jobs.Unique("a")) is None, "a job waiting for its retry still holds the lock"
    run_once(manager)
    assert memory.failed and memory.failed[0].error == "ValueError: unique job failed"
    assert manager.dispatch(jobs.Unique("a")) is not None, "a final failure releases the lock"


def test_unique_for_is_the_net_for_a_dead_worker(manager: QueueManager) -> None:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        manager.dispatch(jobs.Unique("a"))
        frozen.tick(3599)
        assert manager.dispatch(jobs.Unique("a")) is None
        frozen.tick(2)
        assert manager.dispatch(jobs.Unique("a")) is not None


def test_without_a_lock_store_it_dispatches_with_a_warning_every_time(
    registry: Any, caplog: pytest.LogCaptureFixture
) -> None:
    memory = MemoryQueue()
    manager = QueueManager({"m": memory}, registry=registry, container=Container(), locks=None)
    with caplog.at_level(logging.WARNING, logger="rainier_sync"):
        assert manager.dispatch(jobs.Unique("a")) is not None
        assert manager.dispatch(jobs.Unique("a")) is not None
    warnings = [r for r in caplog.records if "no lock store is configured" in r.getMessage()]
    assert len(warnings) == 2
    assert memory.size() == 2


def test_a_failed_push_releases_the_lock(manager: QueueManager, memory: MemoryQueue,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(job: Any) -> str:
        raise ConnectionError("backend down")

    monkeypatch.setattr(memory, "push", broken)
    with pytest.raises(ConnectionError):
        manager.dispatch(jobs.Unique("a"))
    monkeypatch.undo()
    assert manager.dispatch(jobs.Unique("a")) is not None


def test_a_retried_unique_job_takes_its_lock_again(manager: QueueManager, memory: MemoryQueue) -> None:
    failed_id = manager.dispatch(jobs.Unique("r", fail=True))
    assert failed_id is not None
    run_once(manager)
    assert [f.id for f in memory.failed] == [failed_id]
    assert manager.retry_failed(failed_id) is True
    assert manager.dispatch(jobs.Unique("r", fail=True)) is None, "the retried copy holds the lock: a duplicate"
    assert [j.id for j in memory.jobs] == [failed_id]


def test_a_failed_unique_job_is_not_retried_while_a_live_copy_holds_its_lock(
    manager: QueueManager, memory: MemoryQueue
) -> None:
    from rainier_sync.errors import UniqueLockHeldError

    failed_id = manager.dispatch(jobs.Unique("r", fail=True))
    assert failed_id is not None
    run_once(manager)
    live_id = manager.dispatch(jobs.Unique("r"))
    assert live_id is not None
    with pytest.raises(UniqueLockHeldError, match=f"failed job {failed_id} .*unique .*its failed entry is kept"):
        manager.retry_failed(failed_id)
    assert [f.id for f in memory.failed] == [failed_id]
    assert [j.id for j in memory.jobs] == [live_id]
    run_once(manager)  # the live copy finishes and lets go of the lock
    assert manager.retry_failed(failed_id) is True
    assert manager.retry_failed("no-such-id") is False
