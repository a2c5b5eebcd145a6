"""Rate-limit benchmark: how full a backlog keeps a ``RateLimited`` window.

    .venv/bin/python tests/benchmarks/bench_rate_backlog.py [--limit 50] [--seconds 10] [--warmup 3]
        [--processes 2] [--threads 8] [--backends postgres,redis]

``(warmup + seconds + 10) * limit`` no-op jobs under ``RateLimited(limit, per=1)``
are queued, then ``--processes`` resident worker processes of ``--threads``
threads drain them (``tests/contract/middleware_worker.py``, each job noting
when its ``handle`` began), on PostgreSQL (``POSTGRES_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``, in a schema of the run's own)
and on Redis (``REDIS_URL``, default ``redis://127.0.0.1:6379/13``, under a
prefix of its own), the lock store on the same server. After ``--warmup``
seconds from the first start, the starts of each of the next ``--seconds``
seconds are printed, with their mean and the lowest, and the most starts in any one second
(a sliding window over every start, which must never pass the limit). The
backlog never runs out while it is measured. A backend that cannot be
reached is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import sys
import tempfile
import time
import uuid
from typing import Any, Iterator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from rainier_sync import QueueManager  # noqa: E402
from tests.contract import middleware_jobs  # noqa: E402
from tests.contract.processes import Backend, Workers, connect  # noqa: E402
from tests.drivers.database.support import with_search_path  # noqa: E402


@contextlib.contextmanager
def place(kind: str, ledger: pathlib.Path) -> Iterator[Backend]:
    """A backend of ``kind`` in a place of this run's own, removed after."""
    prefix, queue = f"bench-rate:{uuid.uuid4().hex[:8]}:", f"q-{uuid.uuid4().hex[:8]}"
    if kind == "postgres":
        import psycopg

        base = os.environ.get("POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
        schema = f"bench_rate_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        url = with_search_path(base, schema)
    else:
        url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
    driver, locks = connect(kind, url, prefix, queue, 30.0, url)
    if kind == "postgres":
        locks.migrate()
    manager = QueueManager({kind: driver}, locks=locks, registry=middleware_jobs.registry())
    try:
        yield Backend(kind, url, prefix, queue, manager, ledger, url)
    finally:
        manager.close()
        if kind == "postgres":
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        else:
            import redis

            client = redis.Redis.from_url(url)
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()


def starts(ledger: pathlib.Path) -> list[float]:
    """When each job's ``handle`` began, every process's ledger merged."""
    found = []
    for path in ledger.glob("*.log"):
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            if line.endswith("\n"):
                found.append(float(line.split()[2]))
    return sorted(found)


def most_in_a_second(times: list[float]) -> int:
    most, first = 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def run(kind: str, args: argparse.Namespace, root: pathlib.Path) -> None:
    ledger = root / kind
    ledger.mkdir()
    total = (args.warmup + args.seconds + 10) * args.limit
    workers = Workers("tests.contract.middleware_worker", root)
    with place(kind, ledger) as backend:
        limiter = f"bench-{uuid.uuid4().hex[:8]}"
        backend.dispatch([middleware_jobs.Limited(str(ledger), n, limiter, args.limit, 1.0) for n in range(total)])
        procs: list[Any] = []
        try:
            for _ in range(args.processes):
                procs.append(workers.start(backend, "forever", str(args.threads), "0.1", str(ledger)))
            deadline = time.monotonic() + 60
            while not starts(ledger) and time.monotonic() < deadline:
                time.sleep(0.1)
            seen = starts(ledger)
            if not seen:
                print(f"{kind}: no job started within 60 s")
                return
            time.sleep(max(0.0, seen[0] + args.warmup + args.seconds + 1.0 - time.time()))
        finally:
            stats = [workers.stop(proc) for proc in procs]
            workers.close()
        times = starts(ledger)
        begin = times[0] + args.warmup
        counts = [sum(begin + s <= at < begin + s + 1 for at in times) for s in range(args.seconds)]
        left = total - len(times)
        mean = sum(counts) / args.seconds
        print(
            f"{kind:9s} per second: {' '.join(f'{c:3d}' for c in counts)}   mean {mean:5.1f}/s "
            f"({100 * mean / args.limit:3.0f}% of {args.limit}, lowest second {min(counts)})   "
            f"most in any 1 s: {most_in_a_second(times)}   "
            f"deferred {sum(s['deferred'] for s in stats)}   backlog left {left}   (load {os.getloadavg()[0]:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--backends", default="postgres,redis")
    args = parser.parse_args()
    print(f"RateLimited({args.limit}, per=1): {args.processes} worker processes x {args.threads} threads")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.backends.split(","):
            try:
                run(kind, args, pathlib.Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a benchmark skips what it cannot reach
                print(f"{kind} skipped: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
