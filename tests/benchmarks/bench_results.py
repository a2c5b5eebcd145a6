"""Results and chains benchmark: how soon ``result(wait=...)`` sees a finished job,
and how fast a chain hands over from link to link.

    .venv/bin/python tests/benchmarks/bench_results.py [--jobs 200] [--links 100] [--backends memory,redis,postgres]

Backends: ``memory`` (MemoryQueue + MemoryLockStore), ``redis`` (RedisQueue +
RedisLockStore under a fresh key prefix, deleted afterwards; ``TEST_REDIS_URL``,
default ``redis://127.0.0.1:6379/13``) and ``postgres`` (DatabaseQueue +
DatabaseLockStore in a fresh schema, dropped afterwards; ``TEST_POSTGRES_URL``,
default ``postgresql://postgres@127.0.0.1:5432/test``). A backend whose server
does not answer is skipped. The worker runs on a thread of this process, with
its own manager and store (as another process would).

- result latency: a job keeping its result (``KEEP_RESULT``, a no-op) is
  dispatched, then ``manager.result(job_id, wait=5)`` is called at once;
  latency = when ``result()`` returned - when the job's ``handle`` returned
  (``time.perf_counter`` in the same process). One job at a time, ``--jobs``
  of them after 10 for warm-up; p50, p95 and the worst. A result still
  ``pending`` after 5 s is counted apart (with how many of those jobs had
  finished before ``dispatch()`` returned), not in the percentiles.
- chain: a chain of ``--links`` no-op links; from ``dispatch()`` to the last
  link's ``handle``; links per second, the median of three chains.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions  # noqa: E402
from rainier_sync.drivers import MemoryQueue  # noqa: E402
from rainier_sync.locks import MemoryLockStore  # noqa: E402

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

#: When each Kept job's handle returned, by job id.
returned: dict[str, float] = {}


@dataclass
class Kept(Job):
    NAME = "bench.results.kept"
    KEEP_RESULT = 600

    def handle(self, context: JobContext) -> None:
        returned[context.id] = time.perf_counter()


@dataclass
class Link(Job):
    NAME = "bench.results.link"

    n: int = 0
    last: int = 0
    done: ClassVar[threading.Event] = threading.Event()
    finished_at: ClassVar[float] = 0.0

    def handle(self, context: JobContext) -> None:
        if self.n == self.last:
            Link.finished_at = time.perf_counter()
            Link.done.set()


REGISTRY = JobRegistry().with_job(Kept).with_job(Link)


class Backend:
    """Makes managers that share one queue and one lock store; ``close()`` cleans up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cleanup: list[Callable[[], None]] = []
        self._managers: list[QueueManager] = []
        if name == "memory":
            self._queue = MemoryQueue()
            self._locks = MemoryLockStore()
        elif name == "redis":
            self.prefix = f"bench:results:{uuid.uuid4().hex[:10]}:"
        elif name == "postgres":
            import psycopg

            schema = f"rainier_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{schema}"')
            parts = urllib.parse.urlsplit(POSTGRES_URL)
            query = urllib.parse.urlencode({"options": f"-c search_path={schema}"}, quote_via=urllib.parse.quote)
            self.url = urllib.parse.urlunsplit(parts._replace(query=query))

            def drop() -> None:
                with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

            self._cleanup.append(drop)
            from rainier_sync.drivers.database import DatabaseQueue

            queue = DatabaseQueue.from_url(self.url)
            queue.migrate()
            queue.close()
        else:
            raise ValueError(f"unknown backend {name!r}")

    def manager(self) -> QueueManager:
        if self.name == "memory":
            manager = QueueManager({"q": self._queue}, registry=REGISTRY, container=Container(), locks=self._locks)
        elif self.name == "redis":
            from rainier_sync.drivers.redis import RedisQueue
            from rainier_sync.locks import RedisLockStore

            driver = RedisQueue.from_url(REDIS_URL, prefix=self.prefix)
            locks = RedisLockStore.from_url(REDIS_URL, prefix=self.prefix + "lock:")
            manager = QueueManager({"q": driver}, registry=REGISTRY, container=Container(), locks=locks)
            if not self._cleanup:
                self._cleanup.append(lambda: _delete_keys(driver, self.prefix))
        else:
            from rainier_sync.drivers.database import DatabaseQueue
            from rainier_sync.locks import DatabaseLockStore

            manager = QueueManager(
                {"q": DatabaseQueue.from_url(self.url)}, registry=REGISTRY, container=Container(),
                locks=DatabaseLockStore.from_url(self.url),
            )  # fmt: skip
        self._managers.append(manager)
        return manager

    def close(self) -> None:
        for manager in self._managers:
            if manager.locks is not None:
                manager.locks.close()
            manager.close()
        for step in self._cleanup:
            step()


def _delete_keys(driver: Any, prefix: str) -> None:
    client = driver.client
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)


def reachable(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), timeout=1):
            return True
    except OSError:
        return False


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def working(backend: Backend) -> tuple[QueueManager, Worker]:
    """A manager for the caller, and a started worker with a manager of its own."""
    caller = backend.manager()
    worker = Worker(backend.manager(), options=WorkerOptions(concurrency=1, sleep=1.0))
    worker.start()
    time.sleep(0.3)  # let the worker reach its idle wait
    return caller, worker


def bench_result_latency(backend: Backend, jobs: int) -> dict[str, float]:
    caller, worker = working(backend)
    latencies: list[float] = []
    timeouts = early = 0
    try:
        for i in range(jobs + 10):
            job_id = caller.dispatch(Kept())
            dispatched = time.perf_counter()
            assert job_id is not None
            result = caller.result(job_id, wait=5)
            seen = time.perf_counter()
            if result.status != "processed" or job_id not in returned:
                timeouts += 1
                early += job_id in returned and returned[job_id] < dispatched
                continue
            if i >= 10:
                latencies.append(seen - returned[job_id])
    finally:
        worker.stop(grace=5)
        worker.join(10)
    ms = [x * 1000 for x in latencies]
    return {
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "max": max(ms),
        "not_seen": timeouts,
        "early": early,
    }


def bench_chain(backend: Backend, links: int) -> float:
    caller, worker = working(backend)
    rates: list[float] = []
    try:
        for _ in range(3):
            Link.done.clear()
            started = time.perf_counter()
            caller.chain([Link(n, links - 1) for n in range(links)]).dispatch()
            if not Link.done.wait(120):
                raise RuntimeError(f"a chain of {links} links did not finish within 120 s")
            rates.append(links / (Link.finished_at - started))
    finally:
        worker.stop(grace=5)
        worker.join(10)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--backends", default="memory,redis,postgres")
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f}; {args.jobs} results, chains of {args.links} links")
    urls = {"redis": REDIS_URL, "postgres": POSTGRES_URL}
    for name in args.backends.split(","):
        if name in urls and not reachable(urls[name]):
            print(f"{name:9} skipped: nothing answers at {urls[name]}")
            continue
        backend = Backend(name)
        try:
            got = bench_result_latency(backend, args.jobs)
            rate = bench_chain(backend, args.links)
        finally:
            backend.close()
        print(
            f"{name:9} result(wait) after the job finished: p50 {got['p50']:.2f} ms, p95 {got['p95']:.2f} ms, "
            f"max {got['max']:.2f} ms; {got['not_seen']:.0f} still pending after 5 s ({got['early']:.0f} of them "
            "finished before dispatch() returned); "
            f"chain: {rate:,.0f} links/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
