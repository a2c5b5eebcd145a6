from __future__ import annotations

from typing import Any

from freezegun import freeze_time

from rainier_sync import QueuedJob, QueueManager
from rainier_sync.drivers import MemoryQueue

from . import jobs


def test_drain_runs_what_is_due_and_returns_how_many_ran(manager: QueueManager, memory: MemoryQueue) -> None:
    with freeze_time("2026-01-01") as frozen:
        manager.dispatch(jobs.Record(1))
        manager.dispatch_after(10, jobs.Record(2))
        assert memory.drain() == 1
        assert memory.size() == 1
        frozen.tick(10)
        assert memory.drain() == 1
    assert jobs.calls == [("record", 1), ("record", 2)]


def test_drain_honours_priority_across_queues(manager: QueueManager) -> None:
    manager.pending(jobs.Record("late")).priority(10).send()
    manager.pending(jobs.Record("urgent")).on_queue("other").priority(-10).send()
    manager.dispatch(jobs.Record("normal"))
    manager.connection().drain()  # type: ignore[attr-defined]
    assert [v for _, v in jobs.calls] == ["urgent", "normal", "late"]


def test_drain_retries_with_backoff_and_dead_letters(manager: QueueManager, memory: MemoryQueue) -> None:
    with freeze_time("2026-01-01") as frozen:
        manager.dispatch(jobs.Flaky())
        assert memory.drain() == 1
        frozen.tick(4)
        assert memory.drain() == 0, "its 5 s backoff is not over"
        frozen.tick(1)
        assert memory.drain() == 1
        frozen.tick(5)
        assert memory.drain() == 1
    assert memory.size() == 0
    assert [f.name for f in memory.failed] == ["tests.flaky"]
    assert memory.retry_failed(memory.failed[0].id)
    assert memory.size() == 1 and memory.jobs[0].attempts == 0


def test_jobs_size_and_counts(manager: QueueManager, memory: MemoryQueue) -> None:
    with freeze_time("2026-01-01"):
        manager.dispatch(jobs.Record(1))
        manager.dispatch_on("mail", jobs.Record(2))
        manager.dispatch_after(60, jobs.Record(3))
        assert memory.reserve(["default"]) is not None
        assert memory.size() == 3
        assert memory.size("mail") == 1
        assert len(memory.jobs) == 3
        counts = memory.counts("default")
        assert (counts.ready, counts.delayed, counts.reserved) == (0, 1, 1)
        assert memory.queue_names() == ["default", "mail"]


def taken_over(manager: QueueManager, memory: MemoryQueue, frozen: Any) -> tuple[QueuedJob, QueuedJob]:
    """A job reserved by a worker whose reservation lapsed, and by the one that reclaimed it."""
    manager.dispatch(jobs.Record(1))
    stale = memory.reserve(["default"])
    frozen.tick(31)
    memory.reclaim_expired()
    current = memory.reserve(["default"])
    assert stale is not None and current is not None and current.attempts == 2
    return stale, current


def test_an_acknowledge_by_a_worker_whose_reservation_was_taken_over_is_ignored(memory: MemoryQueue,
                                                                              manager: QueueManager) -> None:
    with freeze_time("2026-01-01") as frozen:
        stale, current = taken_over(manager, memory, frozen)
        memory.release(stale, 0)
        memory.acknowledge(stale)
        assert memory.reserve(["default"]) is None, "the stale holder must not disturb the new reservation"
        memory.acknowledge(current)
        assert memory.size() == 0


def test_a_fail_by_a_worker_whose_job_was_reclaimed_stores_nothing(manager: QueueManager,
                                                                   memory: MemoryQueue) -> None:
    with freeze_time("2026-01-01") as frozen:
        stale, current = taken_over(manager, memory, frozen)
        memory.fail(stale, "too late")
        assert memory.failed == [] and memory.size() == 1
        memory.acknowledge(current)
        assert memory.size() == 0


def test_a_page_walked_from_the_heaps_is_the_page_a_full_sort_gives() -> None:
    # Given jobs pushed, reserved, released (now and later), acknowledged and come due, at random
    import random

    rng = random.Random(7)
    with freeze_time("2026-01-01 12:00:00") as clock:
        queue = MemoryQueue(reservation=60)
        for n in range(400):
            queue.push(QueuedJob(id=f"j{n}", name="t", queue="q", payload={}, priority=rng.randint(-2, 2),
                                 available_at=1767268800.0 + rng.choice([0, 0, 5, 30])))  # fmt: skip
        for _ in range(6):
            for job in queue.reserve_many(["q"], 40):
                rng.choice([queue.acknowledge, lambda j: queue.release(j, 0), lambda j: queue.release(j, 20), id])(job)
            clock.tick(7)

        # Then every page of the walk is the same slice of one full, sorted listing
        for state in ("ready", "delayed", "reserved"):
            whole = [listed.job.id for listed in queue.list_jobs("q", state, name="t", limit=10_000)]
            walked = [
                listed.job.id
                for offset in range(0, len(whole) + 30, 30)
                for listed in queue.list_jobs("q", state, offset=offset, limit=30)
            ]
            assert walked == whole, state
            assert whole, f"no {state} job to compare"

        # ... and the ready jobs come in the order a worker then takes them
        ready = [listed.job.id for listed in queue.list_jobs("q", "ready", limit=10_000)]
        assert [job.id for job in queue.reserve_many(["q"], 10_000)] == ready


def test_a_name_filter_looks_at_the_first_listing_scan_jobs_and_says_so() -> None:
    queue = MemoryQueue(reservation=60)
    queue.listing_scan = 20
    queue.push_many([QueuedJob(id=f"j{n}", name="a.plain" if n < 30 else "b.wanted", queue="q", payload={},
                               available_at=0.0) for n in range(40)])  # fmt: skip
    page = queue.list_jobs("q", "ready", name="wanted")
    assert list(page) == [] and page.bound == 20 and not page.complete
    page = queue.list_jobs("q", "ready", name="PLAIN", limit=5)
    assert [listed.job.id for listed in page] == [f"j{n}" for n in range(5)] and page.complete
