"""The fleet: workers recording themselves in the lock store, and their counts per minute."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Iterator

import pytest
from freezegun import freeze_time

from rainier_sync import ConfigurationError, Container, JobRegistry, QueueManager, Worker, WorkerOptions, fleet, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.fleet import RECORD_TTL, MinuteCounts, WorkerInfo
from rainier_sync.locks import MemoryLockStore
from rainier_sync.worker import loop

from . import jobs


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``check`` (a state kept in the lock store, which no event announces) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never came true"
        time.sleep(0.01)


@pytest.fixture
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers refresh their records every 20 ms instead of every few seconds."""
    monkeypatch.setattr(fleet, "RECORD_EVERY", 0.02)
    monkeypatch.setattr(loop, "RECORD_EVERY", 0.02)


@pytest.fixture
def started() -> Iterator[list[Worker]]:
    running: list[Worker] = []
    yield running
    for event in jobs.Blocking.events.values():
        event.set()
    for worker in running:
        worker.stop()
        worker.join(5)


def test_two_workers_record_themselves_with_what_they_run(
    manager: QueueManager, often: None, started: list[Worker]
) -> None:
    for name in ("a", "b"):
        jobs.Blocking.started[name] = threading.Event()
    manager.dispatch(jobs.Blocking("a"))
    manager.dispatch_on("other", jobs.Blocking("b"))
    began = time.time()
    first = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2))
    second = Worker(manager, options=WorkerOptions(queues=["other", "low"], concurrency=3))
    for worker in (first, second):
        started.append(worker)
        worker.start()
    assert jobs.Blocking.started["a"].wait(5) and jobs.Blocking.started["b"].wait(5)

    def both_running() -> bool:
        found = manager.workers()
        return len(found) == 2 and all(w.running_count == 1 for w in found)

    eventually(both_running)
    found = {w.id: w for w in manager.workers()}
    assert first.fleet is not None and second.fleet is not None
    assert set(found) == {first.fleet.id, second.fleet.id}
    info = found[second.fleet.id]
    assert isinstance(info, WorkerInfo)
    assert info.id.startswith(f"{socket.gethostname()}-{os.getpid()}-")
    assert (info.host, info.pid, info.connection) == (socket.gethostname(), os.getpid(), "main")
    assert (info.queues, info.concurrency) == (("other", "low"), 3)
    assert info.version and info.version != "unknown"
    assert began - 1 <= info.started <= info.last_heartbeat <= time.time() + 1
    (job,) = info.running
    assert (job.name, job.queue) == (jobs.Blocking.NAME, "other")
    assert info.started - 1 <= job.started <= time.time() + 1
    assert manager.workers("main") == manager.workers()


def test_a_stopped_worker_leaves_the_list(manager: QueueManager, often: None, started: list[Worker]) -> None:
    staying = Worker(manager, options=WorkerOptions(concurrency=1))
    leaving = Worker(manager, options=WorkerOptions(concurrency=1))
    for worker in (staying, leaving):
        started.append(worker)
        worker.start()
    eventually(lambda: len(manager.workers()) == 2)
    leaving.stop()
    leaving.join(5)
    assert [w.id for w in manager.workers()] == [staying.fleet.id]  # type: ignore[union-attr]
    assert manager.locks is not None
    assert manager.locks.flags("workers:main") == {staying.fleet.id}  # type: ignore[union-attr]


def test_a_worker_that_died_ages_out(manager: QueueManager) -> None:
    with freeze_time("2026-03-01 12:00:00") as frozen:
        dead = Worker(manager, options=WorkerOptions(concurrency=1))
        assert dead.fleet is not None
        dead.fleet.refresh()  # recorded, then never refreshed nor removed
        assert [w.id for w in manager.workers()] == [dead.fleet.id]
        frozen.tick(RECORD_TTL - 1)
        assert len(manager.workers()) == 1
        frozen.tick(2)
        assert manager.workers() == []
        assert manager.locks is not None and manager.locks.flags("workers:main") == set()


def test_counts_per_minute_are_summed_over_workers_and_connections(registry: JobRegistry) -> None:
    locks = MemoryLockStore()
    one, two = MemoryQueue(reservation=30), MemoryQueue(reservation=30)
    manager = QueueManager({"one": one, "two": two}, "one", registry, Container(), locks=locks)
    manager.dispatch_many([jobs.Record(n) for n in range(3)])
    manager.dispatch_on("other", jobs.Record("x"))
    manager.dispatch(jobs.Flaky())  # fails with tries left: released
    manager.pending(jobs.Record("y")).on_connection("two").send()
    Worker(manager, options=WorkerOptions(queues=["default", "other"], once=True)).run()
    Worker(manager, options=WorkerOptions(once=True), connection="two").run()

    rows = manager.throughput(minutes=5)
    assert len(rows) == 5 and all(isinstance(r, MinuteCounts) for r in rows)
    assert [r.minute for r in rows] == sorted(r.minute for r in rows) and rows[-1].minute % 60 == 0
    assert rows[-1].minute <= time.time() < rows[-1].minute + 60

    def summed(found: list[MinuteCounts]) -> dict[str, dict[str, int]]:
        total: dict[str, dict[str, int]] = {}
        for row in found:
            for queue, counts in row.by_queue.items():
                for outcome, n in counts.items():
                    total.setdefault(queue, {})
                    total[queue][outcome] = total[queue].get(outcome, 0) + n
        return total

    assert summed(rows) == {"default": {"processed": 4, "released": 1}, "other": {"processed": 1}}
    assert summed(manager.throughput("two", minutes=5)) == {"default": {"processed": 1}}
    assert sum(r.processed for r in rows) == 5 and sum(r.released for r in rows) == 1
    assert sum(r.failed + r.deferred for r in rows) == 0


class CountingStore(MemoryLockStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def tally_add(self, key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        self.calls["tally_add"] = self.calls.get("tally_add", 0) + 1
        return super().tally_add(key, counts, ttl)

    def put_value(self, key: str, value: str, ttl: float) -> None:
        self.calls["put_value"] = self.calls.get("put_value", 0) + 1
        super().put_value(key, value, ttl)


def test_counts_are_written_with_the_refresh_not_per_job(registry: JobRegistry) -> None:
    locks = CountingStore()
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container(), locks=locks)
    manager.dispatch_many([jobs.Record(n) for n in range(200)])
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=4)).run()
    assert stats.processed == 200
    # Begun and left within one refresh: the record written twice, the counts once (twice across a minute).
    assert locks.calls["put_value"] == 2
    assert 1 <= locks.calls["tally_add"] <= 2
    assert sum(r.processed for r in manager.throughput(minutes=2)) == 200


class FailingStore(MemoryLockStore):
    def put_value(self, key: str, value: str, ttl: float) -> None:
        raise ConnectionError("lock store down")

    def tally_add(self, key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        raise ConnectionError("lock store down")


def test_a_store_that_fails_is_reported_and_the_worker_goes_on(registry: JobRegistry) -> None:
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container(), locks=FailingStore())
    manager.dispatch_many([jobs.Record(n) for n in range(5)])
    failed: list[str] = []

    def on_failure(sender: Any, **kwargs: Any) -> None:
        failed.append(kwargs["operation"])

    signals.queue_operation_failed.connect(on_failure)
    try:
        stats = Worker(manager, options=WorkerOptions(once=True)).run()
    finally:
        signals.queue_operation_failed.disconnect(on_failure)
    assert stats.processed == 5
    assert "record_worker" in failed and "count_throughput" in failed


def test_counts_the_store_refused_are_written_later(registry: JobRegistry) -> None:
    locks = MemoryLockStore()
    refusing = {"on": True}
    original = locks.tally_add

    def tally_add(key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        if refusing["on"]:
            raise ConnectionError("lock store down")
        return original(key, counts, ttl)

    locks.tally_add = tally_add  # type: ignore[method-assign]
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container(), locks=locks)
    worker = Worker(manager, options=WorkerOptions(once=True))
    assert worker.fleet is not None
    manager.dispatch_many([jobs.Record(n) for n in range(3)])
    worker.run()
    assert manager.throughput(minutes=2)[-1].processed == 0
    refusing["on"] = False
    worker.fleet.flush()
    assert sum(r.processed for r in manager.throughput(minutes=2)) == 3


def test_without_a_lock_store_there_is_no_fleet(registry: JobRegistry) -> None:
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container(), locks=None)
    worker = Worker(manager, options=WorkerOptions(once=True))
    assert worker.fleet is None
    with pytest.raises(ConfigurationError, match="listing the workers needs a lock store.*locks="):
        manager.workers()
    with pytest.raises(ConfigurationError, match="throughput needs a lock store.*locks="):
        manager.throughput()


def test_a_manager_given_no_locks_records_its_workers_in_its_memory_queue(registry: JobRegistry) -> None:
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container())
    worker = Worker(manager, options=WorkerOptions(once=True))
    assert worker.fleet is not None and worker.fleet.locks is manager.locks


def test_an_undeclared_connection_is_an_error(manager: QueueManager) -> None:
    from rainier_sync.errors import UnknownConnectionError

    with pytest.raises(UnknownConnectionError):
        manager.workers("nope")
    with pytest.raises(UnknownConnectionError):
        manager.throughput("nope")


def test_wait_times_of_first_attempts_are_counted_per_queue_in_buckets(manager: QueueManager) -> None:
    with freeze_time("2026-03-01 12:00:00") as frozen:
        manager.dispatch_many([jobs.Record(n) for n in range(3)])
        manager.dispatch_on("other", jobs.Record("x"))
        manager.dispatch_after(5, jobs.Record("delayed"))  # waits from when it fell due, not from its dispatch
        manager.dispatch(jobs.Flaky())  # released after its first attempt: the second does not count
        frozen.tick(7)
        manager.dispatch(jobs.Record("fresh"))
        stats = Worker(manager, options=WorkerOptions(queues=["default", "other"], once=True)).run()
        assert (stats.processed, stats.released) == (6, 1)
        frozen.tick(5)
        assert Worker(manager, options=WorkerOptions(once=True)).run().released == 1
        (row,) = manager.throughput(minutes=1)

    assert row.waits == {"default": {10.0: 4, 2.5: 1, 0.005: 1}, "other": {10.0: 1}}
    assert row.by_queue == {"default": {"processed": 5, "released": 2}, "other": {"processed": 1}}
    assert row.wait_buckets() == {10.0: 5, 2.5: 1, 0.005: 1}
    assert row.wait_buckets("other") == {10.0: 1} and row.wait_buckets("nope") == {}


def test_wait_percentiles_interpolate_within_a_bucket() -> None:
    from rainier_sync.fleet import merge_buckets, wait_percentile

    assert wait_percentile({}, 0.5) is None
    assert wait_percentile({1.0: 0}, 0.5) is None
    assert wait_percentile({0.005: 4}, 0.5) == pytest.approx(0.0025)  # half-way into (0, 0.005]
    assert wait_percentile({1.0: 4}, 0.5) == pytest.approx(0.75)  # half-way into (0.5, 1], the bucket below empty
    histogram = {0.1: 50, 1.0: 45, 10.0: 5}  # each bucket interpolated from the standard bound below it
    assert wait_percentile(histogram, 0.5) == pytest.approx(0.1)
    assert wait_percentile(histogram, 0.95) == pytest.approx(1.0)
    assert wait_percentile(histogram, 0.99) == pytest.approx(5.0 + 5.0 * 4 / 5)
    assert wait_percentile({1.0: 1, float("inf"): 3}, 0.95) == 14400.0  # past the last bound: that bound
    assert merge_buckets([{1.0: 1}, {1.0: 2, 5.0: 1}]) == {1.0: 3, 5.0: 1}
    with pytest.raises(ValueError, match="between 0 and 1"):
        wait_percentile(histogram, 95)


def test_wait_buckets_go_in_the_same_write_as_the_counts(registry: JobRegistry) -> None:
    locks = CountingStore()
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container(), locks=locks)
    manager.dispatch_many([jobs.Record(n) for n in range(50)])
    assert Worker(manager, options=WorkerOptions(once=True, concurrency=4)).run().processed == 50
    assert 1 <= locks.calls["tally_add"] <= 2  # once per minute written, whatever the buckets
    rows = manager.throughput(minutes=2)
    assert sum(sum(r.wait_buckets().values()) for r in rows) == 50


def test_a_tally_field_of_another_version_is_passed_over(manager: QueueManager) -> None:
    assert manager.locks is not None
    with freeze_time("2026-03-01 12:00:30"):
        fields = {"q|wait<=soon": 2, "q|wait<=1": 3, "q|processed": 3}
        manager.locks.tally_add("throughput:main:1772366400", fields, 60)
        (row,) = manager.throughput(minutes=1)
    assert row.waits == {"q": {1.0: 3}} and row.by_queue == {"q": {"processed": 3}}


class SlowStore(MemoryLockStore):
    """A lock store whose writes of worker records hang until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.go = threading.Event()

    def put_value(self, key: str, value: str, ttl: float) -> None:
        if key.startswith("worker:"):
            self.writing.set()
            assert self.go.wait(10), "test never let the write through"
        super().put_value(key, value, ttl)


def test_a_slow_lock_store_never_holds_up_a_claim(registry: JobRegistry) -> None:
    locks = SlowStore()
    manager = QueueManager({"main": MemoryQueue()}, "main", registry, Container(), locks=locks)
    manager.dispatch_many([jobs.Record(n) for n in range(50)])
    worker = Worker(manager, options=WorkerOptions(once=True, concurrency=2))
    finished: list[Any] = []
    runner = threading.Thread(target=lambda: finished.append(worker.run()))
    runner.start()
    try:
        assert locks.writing.wait(5), "the worker to begin writing its record"
        # Every job runs while the record's write hangs.
        eventually(lambda: sum(1 for kind, _ in jobs.calls if kind == "record") == 50)
        assert not finished, "the run waits for its record's last write"
    finally:
        locks.go.set()
        runner.join(10)
    assert finished and finished[0].processed == 50
    assert manager.workers() == []
    assert sum(r.processed for r in manager.throughput(minutes=2)) == 50


def test_a_worker_whose_loop_is_stuck_leaves_the_list_until_it_turns_again(
    registry: JobRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .test_worker import WedgedQueue

    monkeypatch.setattr(fleet, "RECORD_EVERY", 0.02)
    monkeypatch.setattr(loop, "RECORD_EVERY", 0.02)
    monkeypatch.setattr(fleet, "RECORD_TTL", 0.3)
    wedged = WedgedQueue()
    manager = QueueManager({"main": wedged}, "main", registry, Container(), locks=MemoryLockStore())
    worker = Worker(manager, options=WorkerOptions(sleep=0.01))
    worker.start()
    try:
        assert wedged.entered.wait(5), "the loop to hang"
        assert worker.fleet is not None
        # Its thread still runs, but refreshes no record for a loop that does not turn: it lapses.
        eventually(lambda: manager.workers() == [])
        wedged.release.set()
        eventually(lambda: [w.id for w in manager.workers()] == [worker.fleet.id])  # type: ignore[union-attr]
    finally:
        wedged.release.set()
        worker.stop(grace=0)
        worker.join(5)
