"""Timed jobs through the supervised child pool, against in-thread jobs.

    .venv/bin/python tests/benchmarks/bench_timeouts.py [--jobs 20000] [--children 2] [--repeat 3]

Each round drains a backlog of no-op jobs from the memory driver with a
``once`` worker (from start to empty, child start-up included):

- ``timed``: the job has a ``TIMEOUT``, so every attempt runs in one of
  ``--children`` reused child processes (``concurrency`` = ``--children``);
- ``in-thread``: the same job without a time limit, on as many threads;
- ``timed, 1 child`` and ``in-thread, 1 thread``: one at a time, so the
  difference of their per-job times is the overhead a time limit adds to one
  attempt (a round trip to a child and back);
- ``fork per job``: ``max_jobs_per_child=1``, a new child for every attempt
  (what a fork-per-job worker pays), on a tenth of the backlog.

Prints the median of ``--repeat`` rounds and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue


@dataclass
class Timed(Job):
    NAME = "bench.timed"
    TIMEOUT = 30

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Untimed(Job):
    NAME = "bench.untimed"

    def handle(self, context: JobContext) -> None:
        pass


def drain(job_class: type[Job], jobs: int, concurrency: int, max_jobs_per_child: int | None = 1000) -> float:
    """Seconds to drain ``jobs`` jobs of ``job_class``."""
    queue = MemoryQueue()
    registry = JobRegistry().with_job(job_class)
    manager = QueueManager({"m": queue}, registry=registry, container=Container())
    for start in range(0, jobs, 1000):
        manager.dispatch_many([job_class() for _ in range(min(1000, jobs - start))])
    worker = Worker(
        manager,
        options=WorkerOptions(concurrency=concurrency, once=True, max_jobs_per_child=max_jobs_per_child),
    )
    began = time.perf_counter()
    stats = worker.run()
    took = time.perf_counter() - began
    if stats.processed != jobs or queue.size() != 0:
        raise SystemExit(f"lost jobs: processed {stats.processed} of {jobs}, {queue.size()} left")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, c = args.jobs, args.children
    cases = [
        (f"timed, {c} children", Timed, n, c, 1000),
        (f"in-thread, {c} threads", Untimed, n, c, 1000),
        ("timed, 1 child", Timed, n, 1, 1000),
        ("in-thread, 1 thread", Untimed, n, 1, 1000),
        (f"fork per job, {c} children", Timed, max(1, n // 10), c, 1),
    ]
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    seconds: dict[str, list[float]] = {label: [] for label, *_ in cases}
    for _ in range(args.repeat):
        for label, job_class, jobs, concurrency, per_child in cases:  # interleaved rounds
            seconds[label].append(drain(job_class, jobs, concurrency, per_child))
    print(f"{os.cpu_count()} cores, {args.repeat} rounds, medians; load average before: {load_before}")
    per_job: dict[str, float] = {}
    for label, _, jobs, _, _ in cases:
        took = statistics.median(seconds[label])
        per_job[label] = took / jobs
        rates = ", ".join(f"{jobs / s:,.0f}" for s in seconds[label])
        print(f"  {label:<26} {jobs / took:>9,.0f} jobs/s  ({took / jobs * 1e6:7.1f} us/job; rounds: {rates})")
    overhead = per_job["timed, 1 child"] - per_job["in-thread, 1 thread"]
    print(f"  overhead of a time limit: {overhead * 1e6:.1f} us per attempt (1 child against 1 thread)")
    print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
