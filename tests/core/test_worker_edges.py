"""Edge cases of the worker, the waker and the memory driver found in review."""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers import base as driver_base
from rainier_sync.drivers import waker as waker_module
from rainier_sync.execution import FAILED, RELEASED, Completion
from rainier_sync.types import ExceptionInfo

from . import jobs


def test_a_set_racing_a_clear_leaves_the_flag_and_the_pipe_in_agreement(monkeypatch: pytest.MonkeyPatch) -> None:
    waker = driver_base.Waker()
    real_write = os.write
    cleared = threading.Event()

    def write_after_a_racing_clear(fd: int, data: bytes) -> int:
        # The waiting thread clears while set() is between raising the flag and writing.
        racer = threading.Thread(target=lambda: (waker.clear(), cleared.set()))
        racer.start()
        racer.join(0.2)
        return real_write(fd, data)

    monkeypatch.setattr(waker_module.os, "write", write_after_a_racing_clear)
    waker.set()
    monkeypatch.undo()
    assert cleared.wait(5)
    started = time.monotonic()
    assert waker.wait(0.3) is False
    assert time.monotonic() - started >= 0.25, "a stray byte made the wait return at once"
    waker.close()


def test_a_stop_signal_arriving_while_the_waker_is_being_cleared_does_not_deadlock() -> None:
    # A signal handler runs in the thread it interrupts: stop() then sets the waker
    # from inside that thread's clear(), while it holds the waker's lock.
    waker = driver_base.Waker()
    waker.set()
    done = threading.Event()

    def clear_interrupted_by_a_handler() -> None:
        with waker._lock:
            waker._flag = False  # clear() has lowered the flag, not yet drained the pipe
            waker.set()  # the handler's stop()
        done.set()

    thread = threading.Thread(target=clear_interrupted_by_a_handler, daemon=True)
    thread.start()
    assert done.wait(5), "set() from a handler deadlocked on the lock its own thread holds"
    assert waker.wait(0) is True
    waker.clear()
    assert waker.wait(0.05) is False, "flag and pipe agree again after the next clear"
    waker.close()


def test_a_settle_that_fails_half_way_repeats_only_what_is_left(manager: QueueManager, memory: MemoryQueue,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    manager.dispatch(jobs.Record("gives up"))
    manager.dispatch(jobs.Record("retries"))
    first, second = memory.reserve_many(["default"], 2)
    info = ExceptionInfo(kind="ValueError", message="no")
    worker = Worker(manager)
    worker._claims.claimed([first, second])
    worker._claims.done.extend([Completion(first, FAILED, info=info), Completion(second, RELEASED, delay=0, info=info)])
    real_release, calls = memory.release, {"n": 0}

    def release_once_broken(job: Any, delay: float = 0) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("release lost")
        real_release(job, delay)

    monkeypatch.setattr(memory, "release", release_once_broken)
    failed_signals: list[str] = []

    def on_failed(sender: Any, **kw: Any) -> None:
        failed_signals.append(kw["job"].id)

    signals.job_failed.connect(on_failed)
    try:
        assert worker._claims.settle(0.0) is False
        assert worker._claims.settle(0.0) is True
    finally:
        signals.job_failed.disconnect(on_failed)
    assert [f.id for f in memory.failed] == [first.id], "the failed job is stored once"
    assert failed_signals == [first.id], "and announced once"
    assert (worker.stats.failed, worker.stats.released) == (1, 1)
    assert worker._claims.running == {}


def test_workers_do_not_leak_file_descriptors(manager: QueueManager) -> None:
    def open_fds() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    before = open_fds()
    for _ in range(30):
        Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    assert open_fds() - before < 5


def test_a_wait_that_raises_is_not_retried_in_a_tight_loop(manager: QueueManager, memory: MemoryQueue,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}

    def broken_wait(queues: Any, timeout: float, waker: Any) -> None:
        calls["n"] += 1
        raise ConnectionError("listener lost")

    monkeypatch.setattr(memory, "wait_for_jobs", broken_wait)
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.1))
    worker.start()
    time.sleep(0.5)
    worker.stop()
    worker.join(5)
    assert 1 <= calls["n"] <= 10, f"{calls['n']} waits in 0.5 s with sleep=0.1"


@dataclass
class Exits(Job):
    NAME = "tests.exits"
    TRIES = 2

    def handle(self, context: JobContext) -> None:
        jobs.calls.append(("exits", context.attempt))
        raise SystemExit(3)


def test_a_job_that_exits_is_not_run_past_its_tries(registry: JobRegistry) -> None:
    registry.register(Exits)
    memory = MemoryQueue()
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    manager.dispatch(Exits())
    with pytest.raises(SystemExit):
        memory.drain()  # attempt 1: released, and the drain stops like the process would
    with pytest.raises(SystemExit):
        memory.drain()  # attempt 2, the last: failed for good
    assert memory.drain() == 0
    assert jobs.calls == [("exits", 1), ("exits", 2)]
    assert [f.error for f in memory.failed] == ["SystemExit: 3"]


def test_stop_returns_soon_after_the_grace_with_stuck_handlers(manager: QueueManager) -> None:
    for n in range(4):
        manager.dispatch(jobs.Blocking(f"stuck-{n}"))
    worker = Worker(manager, options=WorkerOptions(concurrency=4, sleep=0.05, grace=0.2))
    worker.start()
    for n in range(4):
        assert jobs.Blocking.started.setdefault(f"stuck-{n}", threading.Event()).wait(5)
    stopped = time.monotonic()
    worker.stop()
    worker.join(10)
    assert time.monotonic() - stopped < 2.5, "one join per stuck thread added a second each"


def test_an_attempt_the_stop_cuts_short_is_handed_back_without_spending_a_try(
    manager: QueueManager, memory: MemoryQueue
) -> None:
    heard: list[tuple[str, str | None]] = []

    def on_interrupted(sender: Any, job: Any, connection: str | None) -> None:
        heard.append((job.name, connection))

    signals.job_interrupted.connect(on_interrupted)
    try:
        manager.dispatch(jobs.Blocking("cut-short"))  # TRIES = 1
        worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05, grace=0.2))
        worker.start()
        assert jobs.Blocking.started.setdefault("cut-short", threading.Event()).wait(5)
        worker.stop()
        stats = worker.join(10)
    finally:
        signals.job_interrupted.disconnect(on_interrupted)
        jobs.Blocking.events.setdefault("cut-short", threading.Event()).set()
    assert (stats.processed, stats.released, stats.failed, stats.interrupted) == (0, 0, 0, 1)
    assert heard == [(jobs.Blocking.NAME, "main")]
    assert memory.failed == [] and not memory._reserved
    [again] = memory.reserve_many(["default"], 1)
    assert again.attempts == 1, "the attempt the stop cut short was spent"


@dataclass
class Mutates(Job):
    NAME = "tests.mutates"
    TRIES = 2

    items: list[int] = field(default_factory=list)

    def handle(self, context: JobContext) -> None:
        jobs.calls.append(("mutates", list(self.items)))
        self.items.append(99)
        raise ValueError("again")


def test_the_memory_driver_keeps_payloads_as_json_would(registry: JobRegistry) -> None:
    registry.register(Mutates)
    memory = MemoryQueue()
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    job = Mutates(items=[1, 2])
    manager.pending(job).send()
    job.items.append(3)  # the dispatcher changes its object afterwards
    assert memory.jobs[0].payload == {"items": [1, 2]}
    from freezegun import freeze_time

    with freeze_time("2026-01-01") as frozen:
        memory.drain()
        frozen.tick(5)
        memory.drain()
    assert jobs.calls == [("mutates", [1, 2]), ("mutates", [1, 2])], "a retry sees the payload as dispatched"


class _UnreadableFirst(MemoryQueue):
    """Memory queue whose first claimed jobs are "unreadable": moved to the failed
    store and announced, as a driver that decodes stored jobs does."""

    def __init__(self, unreadable: int) -> None:
        super().__init__()
        self.unreadable = unreadable

    def reserve_many(self, queues: Any, limit: int) -> list[Any]:
        taken = super().reserve_many(queues, limit)
        kept = []
        for job in taken:
            if self.unreadable:
                self.unreadable -= 1
                info = ExceptionInfo(kind="rainier_sync.errors.PayloadError", message="not JSON")
                self.fail(job, info)
                self.announce_discarded(info, "{not json")
            else:
                kept.append(job)
        return kept


def test_a_once_run_goes_on_past_unreadable_jobs_until_nothing_due_is_left(registry: JobRegistry) -> None:
    queue = _UnreadableFirst(unreadable=2)
    manager = QueueManager({"m": queue}, registry=registry, container=Container())
    for value in ("bad-1", "bad-2", "good"):
        manager.dispatch(jobs.Record(value))
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1, prefetch=0)).run()
    assert (stats.processed, stats.discarded) == (1, 2)
    assert jobs.calls == [("record", "good")]
    assert queue.size() == 0
