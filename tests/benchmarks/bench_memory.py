"""Memory driver benchmark: dispatch and drain rates, and idle dispatch-to-start latency.

    .venv/bin/python tests/benchmarks/bench_memory.py [--jobs 100000] [--threads 8] [--probes 500] [--locks]

Dispatch: ``dispatch`` one at a time and ``dispatch_many`` in batches of 1,000.
Drain: a worker with ``--threads`` threads runs the backlog of no-op jobs
(``once`` mode, from start to empty). Worker alone: the same drain from a
driver that hands out ready-made jobs and does nothing else, with 1, 2 and
``--threads`` threads: what the worker itself costs. Latency: an idle worker (``sleep`` of
60 s, so only the backend's wake-up can start the job early) and one probe at
a time: the time from just before ``dispatch`` to the first line of ``handle``.
``--locks`` gives the manager a memory lock store (paused queues, the worker
registry and fleet throughput then cost what they cost).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchjobs import Noop, Probe, percentile, probe_started, started_at

from rainier_sync import Container, JobRegistry, QueuedJob, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore


class ReadyMade(MemoryQueue):
    """Hands out ``count`` jobs built beforehand; acknowledging them does nothing."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self._left = [QueuedJob(id=str(n), name=Noop.NAME, queue="default", payload={}) for n in range(count)]

    def reserve_many(self, queues: object, limit: int) -> list[QueuedJob]:
        cut = max(0, len(self._left) - limit)
        taken, self._left = self._left[cut:], self._left[:cut]
        for job in taken:
            job.attempts = 1
        return taken

    def acknowledge_many(self, jobs: object) -> None:
        pass

    def reclaim_expired(self) -> int:
        return 0


def worker_alone(jobs: int, threads: int) -> float:
    driver = ReadyMade(jobs)
    m = QueueManager({"r": driver}, registry=JobRegistry().with_job(Noop), container=Container())
    t0 = time.perf_counter()
    stats = Worker(m, options=WorkerOptions(once=True, concurrency=threads)).run()
    assert stats.processed == jobs, stats
    return jobs / (time.perf_counter() - t0)


def manager(locks: bool = False) -> tuple[QueueManager, MemoryQueue]:
    queue = MemoryQueue()
    return QueueManager(
        {"m": queue},
        registry=JobRegistry().with_job(Noop).with_job(Probe),
        container=Container(),
        locks=MemoryLockStore() if locks else None,
    ), queue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--locks", action="store_true", help="give the manager a memory lock store")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")

    m, queue = manager()
    t0 = time.perf_counter()
    for _ in range(args.jobs):
        m.dispatch(Noop())
    single = args.jobs / (time.perf_counter() - t0)

    m, queue = manager(args.locks)
    t0 = time.perf_counter()
    for start in range(0, args.jobs, 1000):
        m.dispatch_many([Noop() for _ in range(min(1000, args.jobs - start))])
    bulk = args.jobs / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    stats = Worker(m, options=WorkerOptions(once=True, concurrency=args.threads)).run()
    drain_s = time.perf_counter() - t0
    assert stats.processed == args.jobs and queue.size() == 0, stats

    m, queue = manager(args.locks)
    worker = Worker(m, options=WorkerOptions(concurrency=args.threads, sleep=60))
    worker.start()
    latencies = []
    time.sleep(0.2)
    for _ in range(args.probes):
        probe_started.clear()
        t0 = time.perf_counter()
        m.dispatch(Probe())
        assert probe_started.wait(5), "probe never started"
        latencies.append((started_at[-1] - t0) * 1000)
        time.sleep(0.002)
    worker.stop()
    worker.join(5)

    alone = {n: worker_alone(args.jobs, n) for n in sorted({1, 2, args.threads})}

    print(f"jobs: {args.jobs}, threads: {args.threads}, lock store: {'memory' if args.locks else 'none'}")
    print(f"dispatch (one at a time): {single:,.0f} jobs/s")
    print(f"dispatch_many (1,000 per call): {bulk:,.0f} jobs/s")
    print(f"drain: {args.jobs / drain_s:,.0f} jobs/s ({drain_s:.2f} s)")
    print("worker alone: " + ", ".join(f"{rate:,.0f} jobs/s with {n} thread(s)" for n, rate in alone.items()))
    print(
        f"idle dispatch-to-start latency over {args.probes} probes: p50 {statistics.median(latencies):.3f} ms, "
        f"p99 {percentile(latencies, 99):.3f} ms"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
