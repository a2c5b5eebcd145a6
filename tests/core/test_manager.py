from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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
