"""Periodic jobs: two schedulers share one lock store, and each tick runs once.

Run it with ``python examples/scheduled.py`` (cron entries need
``pip install 'rainier_sync[schedule]'``). Two managers stand for two hosts
that run the same schedule: they share one queue and one lock store. Their
schedulers are given the time explicitly (``Scheduler.run_due(now=...)``), so
three minutes pass in an instant. Then a scheduler dies between dispatching a
tick and claiming it: the other one dispatches a second copy, and the worker
runs one copy and skips the other (see docs/scheduling.rst).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import ClassVar

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Schedule, Worker, WorkerOptions, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore
from rainier_sync.scheduler import Scheduler

START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc).timestamp()


@dataclass
class Report(Job):
    NAME = "example.report"

    label: str
    ran: ClassVar[list[str]] = []

    def handle(self, context: JobContext) -> None:
        Report.ran.append(context.id)


class DiesOnce(MemoryLockStore):
    """A lock store whose first claim of a tick fails, as if the scheduler died right after dispatching."""

    dead = False

    def acquire(self, key: str, owner: str, ttl: float) -> bool:
        if key.startswith("schedule:") and not self.dead:
            self.dead = True
            raise RuntimeError("the scheduler died here")
        return super().acquire(key, owner, ttl)


def clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%H:%M:%S")


def hosts(locks: MemoryLockStore) -> tuple[MemoryQueue, dict[str, Scheduler]]:
    """Two managers (two hosts) sharing one queue and one lock store, each with its scheduler."""
    queue = MemoryQueue()
    registry = JobRegistry().with_job(Report)
    schedule = (
        Schedule()
        .every(timedelta(minutes=1), Report("minutely"), name="minutely")
        .cron("0 * * * *", Report("hourly"), name="hourly")
    )
    schedulers = {
        host: Scheduler(QueueManager({"main": queue}, registry=registry, container=Container(), locks=locks,
                                     schedule=schedule))
        for host in ("A", "B")
    }
    return queue, schedulers


def work(queue: MemoryQueue, locks: MemoryLockStore) -> tuple[int, int]:
    """Run what was dispatched on a ``once`` worker; returns (processed, skipped)."""
    manager = QueueManager({"main": queue}, registry=JobRegistry().with_job(Report), container=Container(), locks=locks)
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    return stats.processed, stats.skipped


def what_ran(schedulers: dict[str, Scheduler]) -> str:
    """The entries and ticks of the jobs that ran, in tick order."""
    dispatched = {job_id: (tick, name) for s in schedulers.values() for name, tick, job_id in s.dispatched}
    return ", ".join(f"{name} {clock(tick)}" for tick, name in sorted(dispatched[job_id] for job_id in Report.ran))


def main() -> int:
    locks = MemoryLockStore()
    queue, schedulers = hosts(locks)
    # Every 20 s for three minutes both hosts look; which one looks first alternates.
    for step in range(9):
        now = START + 5 + step * 20
        order = ("A", "B") if step % 2 == 0 else ("B", "A")
        for host in order:
            scheduler = schedulers[host]
            before = len(scheduler.dispatched)
            scheduler.run_due(now=now)
            for name, tick, _ in scheduler.dispatched[before:]:
                print(f"{clock(now)} host {host} dispatched {name} (tick {clock(tick)})")
    processed, skipped = work(queue, locks)
    print("ran: " + what_ran(schedulers))
    print(f"processed {processed}, skipped {skipped}")
    first_ok = processed == 4 and skipped == 0 and len(set(Report.ran)) == 4

    # A scheduler dies between the dispatch and the claim: the tick is not lost, and runs once.
    Report.ran.clear()
    locks = DiesOnce()
    queue, schedulers = hosts(locks)
    now = START + 5
    try:
        schedulers["A"].run_due(now=now)
    except RuntimeError as exc:
        # The entries are taken in order: minutely was dispatched, its claim failed, hourly never came.
        print(f"{clock(now)} host A dispatched minutely (tick 12:00:00), then: {exc}")
    schedulers["B"].run_due(now=now + 1)
    for name, tick, _ in schedulers["B"].dispatched:
        print(f"{clock(now + 1)} host B found {name} (tick {clock(tick)}) free and dispatched it")
    print(f"queued: {queue.size()} jobs (two copies of the minutely tick)")
    reasons: list[str] = []

    def skipped_one(sender: object, **event: object) -> None:
        reasons.append(str(event["reason"]))

    signals.job_skipped.connect(skipped_one, weak=False)
    processed, skipped = work(queue, locks)
    signals.job_skipped.disconnect(skipped_one)
    print("ran: " + what_ran(schedulers))
    for reason in reasons:
        key = reason.split()[0]  # "<key> is done by job <id>"
        print(f"skipped a copy: {key} is held by the copy that ran")
    print(f"processed {processed}, skipped {skipped}")
    second_ok = processed == 2 and skipped == 1 and len(Report.ran) == 2
    return 0 if first_ok and second_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
