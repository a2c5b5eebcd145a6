"""Starts taken ahead (rainier_sync._allowance): what lets RateLimited ask its
lock store once for many attempts, and why it never lets a window hold more
than its limit. Time is frozen; a store's answers take time by moving it."""

from __future__ import annotations

import heapq
import random
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync._allowance import GUARD, REACH, Allowance, SlowStore
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore
from rainier_sync.middleware import RateLimited


@dataclass
class Limited(Job):
    NAME = "allowance.limited"

    ran: ClassVar[list[int]] = []

    def middleware(self) -> list[Any]:
        return [RateLimited("api", limit=2, per=10)]

    def handle(self, context: JobContext) -> None:
        Limited.ran.append(1)


class Answering(MemoryLockStore):
    """A memory store whose takes take time: the frozen clock moves on the way
    there and on the way back (``latency`` seconds each way, or random up to it)."""

    def __init__(self, clock: Any, latency: float = 0.0, rng: random.Random | None = None) -> None:
        super().__init__()
        self.clock, self.latency, self.rng = clock, latency, rng
        #: How many starts each take asked for.
        self.asked: list[int] = []

    def _wait(self) -> None:
        if self.latency:
            self.clock.tick(self.rng.uniform(0, self.latency) if self.rng else self.latency)

    def take_many(self, key: str, n: int, limit: int, per: float, hold: float = 0.0) -> tuple[int, list[float]]:
        self.asked.append(n)
        self._wait()
        got = super().take_many(key, n, limit, per, hold)
        self._wait()
        return got


def most_in_a_window(starts: list[float], width: float) -> int:
    starts, most, first = sorted(starts), 0, 0
    for last, start in enumerate(starts):
        while starts[first] <= start - width:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.parametrize(
    ("seed", "latency", "lapses"),
    [(1, 0.005, 0.02), (2, 0.005, 0.02), (3, 0.0005, 0.0), (4, 0.0005, 0.0)],
)
def test_no_window_of_starts_taken_ahead_by_several_processes_holds_more_than_the_limit(
    seed: int, latency: float, lapses: float
) -> None:
    """Three processes' allowances share one store. Attempts come in bursts and
    lulls; the store takes up to ``latency`` each way; now and then the clock
    jumps a whole reach, so starts held ahead lapse unused; each attempt starts
    up to the guard after its check. The ledger of starts never holds more than
    ``limit`` in any window of ``per`` seconds, and the load was more than the
    limit (jobs were deferred; with a quick store, the limit itself was reached)."""
    rng = random.Random(seed)
    limit, per = 300, 1.0
    starts: list[float] = []
    deferred = 0
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = Answering(clock, latency=latency, rng=rng)
        processes = [Allowance(store, "rate:api", limit, per) for _ in range(3)]
        for step in range(6000):
            if step % 500 == 499:
                clock.tick(rng.uniform(0.05, 1.5))  # a lull
            else:
                clock.tick(rng.expovariate(2000 if (step // 100) % 2 else 8000))
            if rng.random() < lapses:
                clock.tick(REACH)
            if rng.choice(processes).acquire() == 0.0:
                starts.append(clock().timestamp() + rng.uniform(0, GUARD))
            else:
                deferred += 1
    assert most_in_a_window(starts, per) <= limit
    assert deferred > 1000, "the load was never above the limit: nothing was checked"
    if not lapses:
        assert most_in_a_window(starts, per) == limit
    assert len(store.asked) < len(starts), "starts were taken several at a time"


def test_a_limit_far_above_the_load_is_taken_in_few_round_trips_by_many_threads() -> None:
    store = Answering(None)
    allowance = Allowance(store, "rate:api", 10_000_000, 1.0)
    waits: list[float] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        waits.extend(allowance.acquire() for _ in range(2000))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert waits == [0.0] * 16000
    assert len(store.asked) <= 16000 / 5, f"{len(store.asked)} round trips for 16000 starts"
    assert max(store.asked) > 8, "more starts than threads were taken at once"


def test_a_limit_near_the_load_is_taken_one_start_at_a_time() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = Answering(clock)
        allowance = Allowance(store, "rate:api", 50, 1.0)
        for _ in range(200):
            clock.tick(0.001)
            allowance.acquire()
    assert set(store.asked) == {1}, "a start ahead is more than 50 a second allows within the reach"


def test_jobs_deferred_by_a_full_window_are_booked_into_its_rooms_in_turn() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = Answering(clock)
        allowance = Allowance(store, "rate:api", 3, 10.0)
        assert [allowance.acquire() for _ in range(3)] == [0.0, 0.0, 0.0]
        held = REACH + GUARD  # each start counts from the end of its reach and guard
        waits = [allowance.acquire() for _ in range(7)]
        # a start in a room is made no sooner than the room, and counted from its hold on:
        # the room it leaves comes round again per + held later
        assert waits == pytest.approx([10 + held] * 3 + [20 + 2 * held] * 3 + [30 + 3 * held])
        assert len(store.asked) == 3, "the take that filled the window named its rooms: not asked again before"
        clock.tick(10 + held)
        assert allowance.acquire() == 0.0


def test_a_job_back_before_its_room_is_booked_into_the_window_it_finds_not_behind_later_rounds() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        allowance = Allowance(Answering(clock), "rate:api", 3, 10.0)
        assert [allowance.acquire() for _ in range(3)] == [0.0, 0.0, 0.0]
        booked = [allowance.acquire() for _ in range(12)]  # four rounds of the window's three rooms
        clock.tick(booked[0] + 0.5)  # the first round starts half a second after its rooms opened
        assert [allowance.acquire() for _ in range(3)] == [0.0, 0.0, 0.0]
        clock.tick(booked[3] - booked[0] - 0.5)  # the second round is back when booked: before its rooms
        waits = [allowance.acquire() for _ in range(3)]
        assert waits == pytest.approx([0.5] * 3), "into the rooms of the window it found, first"
        clock.tick(0.5)
        assert [allowance.acquire() for _ in range(3)] == [0.0, 0.0, 0.0]


def test_a_backlog_deferred_by_two_processes_keeps_the_window_full() -> None:
    """Two processes' allowances, one store, a backlog of 2,000 jobs under 50 a
    second: each job deferred comes back when it was booked, up to 80 ms late (a
    worker's pick-up), and asks again. Over simulated seconds 5 to 25 the window
    is kept at least nine tenths full, and never holds more than the limit."""
    rng = random.Random(7)
    limit, per = 50, 1.0
    with freeze_time("2026-01-01 00:00:00") as clock:
        began = now = clock().timestamp()
        processes = [Allowance(MemoryLockStore(), "rate:api", limit, per)]
        processes.append(Allowance(processes[0].store, "rate:api", limit, per))
        due = [(began + n * 0.0005, n, n % 2) for n in range(2000)]  # (when it asks, job, process)
        heapq.heapify(due)
        starts: list[float] = []
        while due and now < began + 25:
            at, n, process = heapq.heappop(due)
            clock.tick(max(0.0, at - now))
            now = max(now, at)
            wait = processes[process].acquire()
            if wait == 0.0:
                starts.append(now - began)
            else:
                heapq.heappush(due, (now + wait + rng.uniform(0.005, 0.08), n, process))
    assert due, "the backlog lasted"
    assert most_in_a_window(starts, per) <= limit
    measured = [at for at in starts if 5 <= at < 25]
    assert len(measured) >= 0.9 * limit * 20, f"{len(measured) / 20:.1f} starts a second"


def test_a_store_slower_than_the_reach_is_given_a_longer_one() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = Answering(clock, latency=0.1)  # 0.2 s a round trip, ten times the reach
        allowance = Allowance(store, "rate:api", 100, 1.0)
        assert allowance.acquire() == 0.0
        assert len(store.asked) == 3, "the starts of the first two takes lapsed on their way back"


def test_a_store_slower_than_a_quarter_of_the_window_defers_the_job_as_a_failed_one() -> None:
    with freeze_time("2026-01-01 00:00:00") as clock:
        store = Answering(clock, latency=0.2)
        with pytest.raises(SlowStore, match=r"the lock store answered in .* past the 0.250 s its starts can wait"):
            Allowance(store, "rate:api", 100, 1.0).acquire()

        memory = MemoryQueue()
        manager = QueueManager({"m": memory}, registry=JobRegistry().with_job(Limited), container=Container(),
                               locks=Answering(clock, latency=10.0))  # fmt: skip
        manager.dispatch(Limited())
        stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
        assert (stats.processed, stats.deferred) == (0, 1) and Limited.ran == []
        assert memory.jobs[0].attempts == 0
