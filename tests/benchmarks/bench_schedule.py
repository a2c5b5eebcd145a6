"""Scheduling benchmark: what a scheduling pass costs.

    .venv/bin/python tests/benchmarks/bench_schedule.py [--entries 1000] [--passes 2000]

- ``idle pass``: ``Scheduler.run_due()`` over ``--entries`` entries (half
  cron, half intervals) when nothing is due: per pass.
- ``due pass``: a pass in which every entry has a tick due (memory driver,
  memory lock store): per pass and per entry.

Each figure is the best of three runs; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Schedule  # noqa: E402
from rainier_sync.drivers import MemoryQueue  # noqa: E402
from rainier_sync.locks import MemoryLockStore  # noqa: E402
from rainier_sync.scheduler import Scheduler  # noqa: E402


@dataclass
class Beat(Job):
    NAME = "bench.beat"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        pass


def build(entries: int) -> Scheduler:
    schedule = Schedule()
    for n in range(entries):
        if n % 2:
            schedule.cron(f"{n % 60} {n % 24} * * *", Beat(n), name=f"cron-{n}", tz="Europe/Berlin")
        else:
            schedule.every(3600 + n, Beat(n), name=f"every-{n}")
    manager = QueueManager(
        {"m": MemoryQueue()}, registry=JobRegistry().with_job(Beat), container=Container(), locks=MemoryLockStore(),
        schedule=schedule,
    )  # fmt: skip
    return Scheduler(manager)


def best(fn, runs: int = 3) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=2000)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f}; {args.entries} entries")

    scheduler = build(args.entries)
    now = time.time()
    due = best(lambda: build(args.entries).run_due(now), runs=1)
    print(f"due pass:  {due * 1000:.1f} ms ({due / args.entries * 1e6:.0f} us per entry; every entry dispatched)")
    scheduler.run_due(now)  # the first pass dispatches every entry's latest tick

    def idle() -> None:
        for _ in range(args.passes):
            scheduler.run_due()

    per = best(idle) / args.passes
    print(f"idle pass: {per * 1e6:.2f} us (nothing due; next due in {scheduler.next_due - time.time():.0f} s)")

    def idle_entries() -> None:
        scheduler.next_due = 0.0  # make every pass look at each entry, as when one entry is due
        for entry in scheduler.entries:
            scheduler.last[entry.name] = float("inf")
        for _ in range(args.passes // 10):
            scheduler.next_due = 0.0
            scheduler.run_due()

    per_scan = best(idle_entries) / (args.passes // 10)
    print(f"scan pass: {per_scan * 1000:.3f} ms (every entry compared, none dispatched)")


if __name__ == "__main__":
    main()
