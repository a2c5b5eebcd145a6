"""Redis driver benchmark: dispatch, dispatch_many, drain, idle latency, delayed-job lateness.

    .venv/bin/python tests/benchmarks/bench_redis.py [--jobs 10000] [--threads 8] [--repeat 3] [--locks]
        [--cluster [--cluster-url redis+cluster://127.0.0.1:7000,...]]

Uses the Redis at ``REDIS_URL`` (default ``redis://127.0.0.1:6379/13``) under a
fresh key prefix, deleted afterwards. Every job is a no-op. ``--locks`` gives
the manager a Redis lock store under the same prefix (paused queues, the
worker registry and fleet throughput then cost what they cost).

``--cluster`` runs every figure on that server and on a Redis Cluster of three
masters started on loopback for the run (or the one ``--cluster-url`` names),
alternating the two run by run, and prints the cluster's drain as a share of
the single server's. One queue: its keys live on one node of the cluster.

- dispatch: ``manager.dispatch`` one job at a time (2,000 jobs).
- dispatch_many: ``manager.dispatch_many`` of the whole backlog, one call.
- drain: one worker (this process, ``--threads`` threads, ``once``) runs the
  backlog; timed from ``run()`` to its return.
- idle latency: a worker idles; a job is dispatched every 20 ms and records
  when it started; dispatch-to-start, 300 samples.
- delayed lateness: 200 jobs dispatched to an idle worker, due 5 ms apart
  from 0.2 s on; lateness = start - due (negative would be early; the due
  time the driver stores is a few microseconds later than the one measured
  against, so figures err on the late side).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import uuid
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions  # noqa: E402
from rainier_sync.drivers.redis import RedisQueue  # noqa: E402
from rainier_sync.locks import RedisLockStore  # noqa: E402

started: dict[str, float] = {}


@dataclass
class Noop(Job):
    NAME = "bench.redis.noop"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Stamp(Job):
    NAME = "bench.redis.stamp"

    key: str = ""

    def handle(self, context: JobContext) -> None:
        started[self.key] = time.time()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def manager_for(url: str, prefix: str, locks: bool = False) -> tuple[QueueManager, RedisQueue]:
    driver = RedisQueue.from_url(url, prefix=prefix)
    store = RedisLockStore.from_url(url, prefix=prefix + "lock:") if locks else None
    return QueueManager({"redis": driver}, registry=JobRegistry().with_job(Noop).with_job(Stamp), locks=store), driver


def cleanup(driver: RedisQueue, prefix: str) -> None:
    for key in list(driver.client.scan_iter(match=prefix + "*", count=1000)):
        driver.client.delete(key)


def bench_dispatch(url: str, jobs: int, threads: int, locks: bool) -> dict[str, float]:
    prefix = f"bench:{uuid.uuid4().hex[:10]}:"
    manager, driver = manager_for(url, prefix, locks)
    try:
        t0 = time.perf_counter()
        for n in range(2000):
            manager.dispatch(Noop(n))
        single = 2000 / (time.perf_counter() - t0)
        cleanup(driver, prefix)
        batch = [Noop(n) for n in range(jobs)]
        t0 = time.perf_counter()
        manager.dispatch_many(batch)
        many = jobs / (time.perf_counter() - t0)
        worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=threads, once=True))
        t0 = time.perf_counter()
        stats = worker.run()
        drain = stats.processed / (time.perf_counter() - t0)
        assert stats.processed == jobs, stats
        return {"dispatch": single, "dispatch_many": many, "drain": drain}
    finally:
        cleanup(driver, prefix)
        manager.close()


def bench_latency(url: str, threads: int, locks: bool) -> dict[str, float]:
    prefix = f"bench:{uuid.uuid4().hex[:10]}:"
    manager, driver = manager_for(url, prefix, locks)
    producer_manager, producer = manager_for(url, prefix)
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=threads, sleep=1.0))
    worker.start()
    try:
        time.sleep(0.3)  # let the worker reach its idle wait
        sent: dict[str, float] = {}
        for i in range(300):
            key = f"{prefix}idle-{i}"
            sent[key] = time.time()
            producer_manager.dispatch(Stamp(key))
            time.sleep(0.02)
        deadline = time.monotonic() + 10
        while len([k for k in sent if k in started]) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        idle = [(started[k] - sent[k]) * 1000 for k in sent if k in started]
        due: dict[str, float] = {}
        first = time.time() + 0.2
        for i in range(200):
            key = f"{prefix}late-{i}"
            due[key] = first + i * 0.005
            # the manager reads the clock again inside; so the due time it stores is a hair later than ours
            producer_manager.dispatch_after(due[key] - time.time(), Stamp(key))
        deadline = time.monotonic() + 10
        while len([k for k in due if k in started]) < len(due) and time.monotonic() < deadline:
            time.sleep(0.01)
        late = [(started[k] - due[k]) * 1000 for k in due if k in started]
        return {
            "idle_p50_ms": percentile(idle, 50),
            "idle_p99_ms": percentile(idle, 99),
            "idle_missing": len(sent) - len(idle),
            "late_min_ms": min(late),
            "late_p50_ms": percentile(late, 50),
            "late_p99_ms": percentile(late, 99),
            "late_missing": len(due) - len(late),
        }
    finally:
        worker.stop()
        worker.join(10)
        cleanup(driver, prefix)
        manager.close()
        producer_manager.close()


def report(label: str, rates: list[dict[str, float]], latency: dict[str, float]) -> None:
    print(f"-- {label}")
    for name in ("dispatch", "dispatch_many", "drain"):
        values = [r[name] for r in rates]
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{name:>14}: best {max(values):>9,.0f} jobs/s   (runs: {shown})")
    print(
        f"  idle latency: p50 {latency['idle_p50_ms']:.2f} ms, p99 {latency['idle_p99_ms']:.2f} ms"
        f" ({latency['idle_missing']} missing)"
    )
    print(
        f" delayed jobs: earliest {latency['late_min_ms']:+.1f} ms, p50 {latency['late_p50_ms']:+.1f} ms,"
        f" p99 {latency['late_p99_ms']:+.1f} ms late ({latency['late_missing']} missing)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--locks", action="store_true", help="give the manager a Redis lock store")
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--cluster", action="store_true", help="also on a Redis Cluster, alternating")
    parser.add_argument("--cluster-url", help="a Redis Cluster to use instead of starting one")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    targets = {"single server": args.url}
    started = None
    if args.cluster:
        if args.cluster_url:
            targets["cluster"] = args.cluster_url
        else:
            import tempfile

            from tests.services.redis_topologies import Cluster

            started = Cluster(pathlib.Path(tempfile.mkdtemp(prefix="bench-redis-cluster-")))
            targets["cluster"] = started.url
    try:
        rates: dict[str, list[dict[str, float]]] = {label: [] for label in targets}
        for _ in range(args.repeat):  # alternating, so a busy spell on the machine falls on both
            for label, url in targets.items():
                rates[label].append(bench_dispatch(url, args.jobs, args.threads, args.locks))
        latencies = {label: bench_latency(url, args.threads, args.locks) for label, url in targets.items()}
        for label in targets:
            report(label, rates[label], latencies[label])
        if args.cluster:
            single = max(r["drain"] for r in rates["single server"])
            cluster = max(r["drain"] for r in rates["cluster"])
            print(f"cluster drain: {cluster / single:.0%} of the single server's (best of {args.repeat} each)")
    finally:
        if started is not None:
            started.stop()
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
