"""Claiming ahead of the threads: batches for short jobs, none for long ones, and
what a stopping worker does with jobs it claimed but never started."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from rainier_sync import (
    ConfigurationError,
    Container,
    Job,
    JobContext,
    JobRegistry,
    QueueManager,
    Worker,
    WorkerOptions,
)
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers.base import Capabilities
from rainier_sync.worker.pool import Pool
from tests.support import wait_until

from . import jobs


@dataclass
class Slow(Job):
    NAME = "tests.slow"

    def handle(self, context: JobContext) -> None:
        time.sleep(0.12)  # the work being measured: longer than the prefetch window per thread


def claim_limits(memory: MemoryQueue, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    limits: list[int] = []
    real = memory.reserve_many

    def recording(queues: Any, limit: int) -> Any:
        limits.append(limit)
        return real(queues, limit)

    monkeypatch.setattr(memory, "reserve_many", recording)
    return limits


def test_short_jobs_are_claimed_many_to_a_round_trip(manager: QueueManager, memory: MemoryQueue,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    manager.dispatch_many([jobs.Record(i) for i in range(300)])
    limits = claim_limits(memory, monkeypatch)
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()
    assert stats.processed == 300 and memory.size() == 0
    assert limits[0] == 2, "nothing is claimed ahead before a job has shown how long jobs take"
    assert max(limits) > 2 * 4, f"short jobs were still claimed a thread's worth at a time: {limits}"
    assert len(limits) < 300 / 4


def test_long_jobs_are_claimed_only_for_free_threads(registry: JobRegistry, memory: MemoryQueue,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register(Slow)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    manager.dispatch_many([Slow() for _ in range(6)])
    limits = claim_limits(memory, monkeypatch)
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()
    assert stats.processed == 6
    assert limits and max(limits) <= 2, f"jobs longer than the window were claimed ahead: {limits}"


def test_prefetch_zero_claims_only_for_free_threads(manager: QueueManager, memory: MemoryQueue,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    manager.dispatch_many([jobs.Record(i) for i in range(100)])
    limits = claim_limits(memory, monkeypatch)
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=2, prefetch=0)).run()
    assert stats.processed == 100
    assert max(limits) <= 2


def test_a_stopping_worker_gives_back_what_it_claimed_ahead_uncounted(manager: QueueManager,
                                                                      memory: MemoryQueue) -> None:
    manager.dispatch(jobs.Record("warm-up"))  # shows the worker that jobs are short
    manager.dispatch_many([jobs.Blocking(f"b{n}") for n in range(20)])
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=5, prefetch=8))
    worker.start()
    try:
        assert jobs.Blocking.started.setdefault("b0", threading.Event()).wait(5)
        wait_until(lambda: memory.counts("default").reserved == 9, 5, message="eight jobs claimed ahead of the thread")
        worker.stop()
        wait_until(lambda: memory.counts("default").reserved == 1, 5, message="the unstarted jobs to go back")
        jobs.Blocking.events.setdefault("b0", threading.Event()).set()
        stats = worker.join(5)
    finally:
        worker.stop(grace=0)
    assert not worker._thread or not worker._thread.is_alive()
    assert stats.processed == 2
    assert memory.size() == 19
    assert all(job.attempts == 0 for job in memory.jobs), "a job that never started has not been attempted"
    assert [n for n in range(20) if jobs.Blocking.started.get(f"b{n}")] == [0], "nothing started after stop()"


def test_a_job_claimed_later_from_an_earlier_queue_goes_first() -> None:
    seen: list[str] = []
    pool: Pool[tuple[int, str]] = Pool(1, lambda item: seen.append(item[1]))
    try:
        pool.pause()
        rank = {"high": 0, "low": 1}

        def key(item: tuple[int, str]) -> object:
            return (rank[item[1].split("-")[0]], item[0])

        pool.submit([(0, "low-1"), (0, "low-2")], key=key)
        pool.submit([(0, "high-1")], key=key)
        assert [name for _, name in pool.hold()] == ["high-1", "low-1", "low-2"]
        assert seen == []
    finally:
        pool.close()


def test_the_prefetch_option_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="prefetch"):
        WorkerOptions(prefetch=-1)
    assert WorkerOptions(concurrency=3).most_ahead == 24
    assert WorkerOptions(prefetch=0).most_ahead == 0


def test_jobs_finished_while_others_wait_in_the_line_are_acknowledged_soon(manager: QueueManager,
                                                                           memory: MemoryQueue) -> None:
    manager.dispatch(jobs.Record("warm-up"))
    worker = Worker(manager, options=WorkerOptions(concurrency=4, sleep=5, prefetch=16))
    worker.start()
    try:
        wait_until(lambda: memory.size() == 0, 5, message="the warm-up job")
        # Two threads block, two run quick jobs; the rest wait in the line, so too
        # few jobs finish to make a batch and the line never runs dry.
        manager.dispatch_many([jobs.Blocking("b0"), jobs.Blocking("b1"), jobs.Record("q1"), jobs.Record("q2")]
                              + [jobs.Blocking(f"w{n}") for n in range(12)])
        wait_until(lambda: memory.size() <= 14, 2, message="the two quick jobs to be acknowledged")
        for name in ["b0", "b1"] + [f"w{n}" for n in range(12)]:
            jobs.Blocking.events.setdefault(name, threading.Event()).set()
        wait_until(lambda: memory.size() == 0, 5, message="the rest to run")
    finally:
        worker.stop()
        worker.join(5)


class CountingRelease(MemoryQueue):
    """A driver that cannot hand a job back without counting its attempt (as SQS's FIFO queues)."""

    capabilities = Capabilities(give_back=False, wakes=True)


def test_nothing_is_claimed_ahead_from_a_driver_that_cannot_give_jobs_back(
    registry: JobRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = CountingRelease()
    manager = QueueManager({"m": driver}, registry=registry, container=Container())
    manager.dispatch_many([jobs.Record(i) for i in range(100)])
    limits = claim_limits(driver, monkeypatch)
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()
    assert stats.processed == 100
    assert max(limits) <= 2, "a job claimed ahead would spend an attempt when the worker stops"
