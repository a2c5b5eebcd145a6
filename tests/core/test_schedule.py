"""Periodic jobs on the memory driver: ticks under freezegun, exactly once
across schedulers, a crash between dispatch and claim, DST, and bad input."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Schedule, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.errors import ConfigurationError
from rainier_sync.locks import MemoryLockStore
from rainier_sync.scheduler import Scheduler


@dataclass
class Tick(Job):
    NAME = "schedule.tick"

    label: str = "t"
    ran: ClassVar[list[tuple[str, float]]] = []
    event: ClassVar[threading.Event] = threading.Event()

    def handle(self, context: JobContext) -> None:
        from rainier_sync import _clock

        Tick.ran.append((self.label, _clock.now()))
        Tick.event.set()


@pytest.fixture(autouse=True)
def _clean() -> None:
    Tick.ran.clear()
    Tick.event.clear()


def build(schedule: Schedule, locks: Any = None) -> tuple[QueueManager, MemoryQueue]:
    memory = MemoryQueue()
    registry = JobRegistry()
    registry.register(Tick)
    manager = QueueManager(
        {"m": memory}, registry=registry, container=Container(), locks=locks or MemoryLockStore(), schedule=schedule
    )
    return manager, memory


def once(manager: QueueManager) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, schedule=True, concurrency=1)).run()


def test_moving_frozen_time_across_ticks_dispatches_exactly_those_ticks() -> None:
    manager, _ = build(Schedule().every(60, Tick("every-minute")))
    with freeze_time("2026-03-01 12:00:30") as clock:
        worker_runs = 0
        for _ in range(5):
            once(manager)
            worker_runs += 1
            clock.tick(60)
        assert [label for label, _ in Tick.ran] == ["every-minute"] * 5
        assert [when % 60 for _, when in Tick.ran] == [30.0] * 5, "each ran in its own minute"
        once(manager)
        assert len(Tick.ran) == 6
        once(manager)
        assert len(Tick.ran) == 6, "a tick runs once, however many runs see it"


def test_ticks_missed_while_nothing_ran_dispatch_only_the_latest() -> None:
    manager, _ = build(Schedule().every(60, Tick()))
    with freeze_time("2026-03-01 12:00:00") as clock:
        once(manager)
        clock.tick(600)
        once(manager)
    assert len(Tick.ran) == 2


def test_every_tick_is_dispatched_once_across_schedulers_sharing_a_store() -> None:
    locks = MemoryLockStore()
    schedule = Schedule().every(timedelta(seconds=10), Tick()).cron("* * * * *", Tick("cron"), name="cron")
    managers = [build(schedule, locks) for _ in range(3)]
    with freeze_time("2026-03-01 12:00:05") as clock:
        for _ in range(12):
            for manager, _ in managers:
                Scheduler(manager).run_due()
            clock.tick(10)
        for manager, _ in managers:
            Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    every = [when for label, when in Tick.ran if label == "t"]
    cron = [when for label, when in Tick.ran if label == "cron"]
    assert len(every) == 12 and len(cron) == 2, Tick.ran


def test_a_crash_between_dispatch_and_claim_loses_no_tick_and_runs_it_once() -> None:
    class Crashes(MemoryLockStore):
        crash = True

        def acquire(self, key: str, owner: str, ttl: float) -> bool:
            if key.startswith("schedule:") and self.crash:
                self.crash = False
                raise RuntimeError("the scheduler died here")
            return super().acquire(key, owner, ttl)

    locks = Crashes()
    manager, memory = build(Schedule().every(60, Tick()), locks)
    with freeze_time("2026-03-01 12:00:00"):
        with pytest.raises(RuntimeError):
            Scheduler(manager).run_due()  # dispatched, never claimed
        assert memory.size() == 1
        Scheduler(manager).run_due()  # another scheduler finds the tick free: a second copy
        assert memory.size() == 2
        stats = once(manager)
    assert len(Tick.ran) == 1, "one copy runs"
    assert (stats.processed, stats.skipped) == (1, 1)


def test_a_scheduling_worker_wakes_for_the_next_tick() -> None:
    manager, _ = build(Schedule().every(0.5, Tick()))
    worker = Worker(manager, options=WorkerOptions(schedule=True, sleep=30, concurrency=1))
    worker.start()
    try:
        assert Tick.event.wait(10), "a tick ran although the worker sleeps up to 30 s"
        Tick.event.clear()
        assert Tick.event.wait(10), "and the next one"
    finally:
        worker.stop()
        worker.join(10)


def test_cron_in_a_time_zone_follows_daylight_saving_changes() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    entry = next(iter(Schedule().cron("30 2 * * *", Tick(), tz="Europe/Berlin")))
    # 2026-03-29: 02:00 jumps to 03:00; the 02:30 run happens once, at 03:00.
    spring = datetime(2026, 3, 29, 3, 0, 30, tzinfo=berlin).timestamp()
    tick = entry.latest(spring)
    assert tick is not None
    assert datetime.fromtimestamp(tick, berlin).strftime("%H:%M") == "03:00"
    assert datetime.fromtimestamp(entry.following(tick), berlin) == datetime(2026, 3, 30, 2, 30, tzinfo=berlin)
    # 2026-10-25: 02:30 comes twice; it runs once.
    autumn = datetime(2026, 10, 25, 0, 0, tzinfo=timezone.utc).timestamp()  # 02:00 CEST
    first = entry.following(autumn)
    assert entry.following(first) - first > 23 * 3600


@pytest.mark.parametrize(
    ("add", "said"),
    [
        (lambda s: s.cron("*/0 * * * *", Tick()), "minute"),
        (lambda s: s.cron("61 * * * *", Tick()), "minute"),
        (lambda s: s.cron("0 * * * * *", Tick()), "five fields"),
        (lambda s: s.cron("* * *", Tick()), "five fields"),
        (lambda s: s.cron("* * * * *", Tick(), tz="Mars/Olympus"), "Mars/Olympus"),
        (lambda s: s.every(0, Tick()), "every"),
        (lambda s: s.every(-5, Tick()), "every"),
        (lambda s: s.every(timedelta(0), Tick()), "every"),
        (lambda s: s.every(True, Tick()), "every"),
        (lambda s: s.every(60, Tick()).every(30, Tick()), "already in the schedule"),
        (lambda s: s.every(60, "not a job"), "Job instance"),
    ],
)
def test_bad_entries_are_refused_when_added_naming_the_fault(add: Any, said: str) -> None:
    with pytest.raises(ConfigurationError, match=said):
        add(Schedule())


def test_an_unregistered_job_is_refused_when_the_manager_is_built() -> None:
    @dataclass
    class Stray(Job):
        NAME = "schedule.stray"

        def handle(self, context: JobContext) -> None:
            pass

    with pytest.raises(ConfigurationError, match="schedule.stray.*not registered"):
        build(Schedule().every(60, Stray()))


def test_a_scheduling_worker_needs_a_schedule_and_a_lock_store() -> None:
    memory = MemoryQueue()
    registry = JobRegistry()
    registry.register(Tick)
    plain = QueueManager({"m": memory}, registry=registry, container=Container(), locks=MemoryLockStore())
    with pytest.raises(ConfigurationError, match="no schedule"):
        Worker(plain, options=WorkerOptions(schedule=True))
    unlocked = QueueManager(
        {"m": memory}, registry=registry, container=Container(), schedule=Schedule().every(1, Tick()), locks=None
    )
    with pytest.raises(ConfigurationError, match="locks="):
        Worker(unlocked, options=WorkerOptions(schedule=True))
