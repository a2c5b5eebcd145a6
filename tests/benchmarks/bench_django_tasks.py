"""Django tasks benchmark: what ``TasksBackend.enqueue`` costs beside a plain
``manager.dispatch`` of the same job.

    .venv/bin/python tests/benchmarks/bench_django_tasks.py [--ops 50] [--rounds 30] [--backends sqlite,postgres,redis]

Backends: ``sqlite`` (DatabaseQueue on a file in a temporary directory, its own
lock store), ``postgres`` (DatabaseQueue in a fresh schema, dropped afterwards;
``TEST_POSTGRES_URL``, default ``postgresql://postgres@127.0.0.1:5432/test``)
and ``redis`` (RedisQueue under a fresh key prefix, deleted afterwards;
``TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/13``). A backend whose
server does not answer is skipped.

The task is ``add(a, b)``; the job is the task's own job class (the one the
backend dispatches, keeping its result for the backend's ``keep_result``), so
both sides store the same job and its pending-result mark. Paired runs: each
round makes ``--ops`` pairs of one ``manager.dispatch(Job(1, 2))`` and one
``add.enqueue(1, 2)``, side by side in an order that alternates from pair to
pair, each call timed on its own; printed: the median of each kind, their
ratio (enqueue/dispatch) and the median of the pairs' ratios. Nothing runs the jobs; each backend's store is emptied
between rounds. The target: a ratio of at most 1.3.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from typing import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(
    USE_TZ=True,
    TASKS={"default": {"BACKEND": "rainier_sync.django.tasks.TasksBackend", "QUEUES": ["default"]}},
)
django.setup()

import rainier_sync  # noqa: E402
from rainier_sync import QueueManager  # noqa: E402
from rainier_sync.django.tasks import FRAMEWORK, job_class_for  # noqa: E402
from rainier_sync.drivers.database import DatabaseQueue  # noqa: E402

if FRAMEWORK == "django.tasks":
    from django.tasks import task
else:
    from django_tasks import task

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@task()
def add(a: int, b: int) -> int:
    return a + b


def _answers(url: str, port: int) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or port), timeout=1).close()
    except OSError:
        return False
    return True


def make(kind: str, cleanup: list[Callable[[], None]]) -> tuple[QueueManager, Callable[[], None]] | None:
    """A manager on ``kind`` and a function that empties its store."""
    if kind == "sqlite":
        folder = tempfile.mkdtemp()
        queue = DatabaseQueue.from_url(f"sqlite:///{folder}/jobs.db")
        queue.migrate()
        manager = QueueManager(connections={"db": queue})
        return manager, lambda: queue._backend.execute("DELETE FROM rainier_jobs")
    if kind == "postgres":
        if not _answers(POSTGRES_URL, 5432):
            return None
        import psycopg

        schema = f"rainier_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')

        def drop() -> None:
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        cleanup.append(drop)
        query = urllib.parse.urlencode({"options": f"-c search_path={schema}"}, quote_via=urllib.parse.quote)
        queue = DatabaseQueue.from_url(f"{POSTGRES_URL}?{query}")
        queue.migrate()
        manager = QueueManager(connections={"db": queue})
        return manager, lambda: queue._backend.execute("TRUNCATE rainier_jobs, rainier_locks")
    assert kind == "redis"
    if not _answers(REDIS_URL, 6379):
        return None
    from rainier_sync.drivers import RedisQueue

    prefix = f"bench:tasks:{uuid.uuid4().hex[:10]}:queue:"
    redis_queue = RedisQueue.from_url(REDIS_URL, prefix=prefix)
    manager = QueueManager(connections={"redis": redis_queue})

    def empty() -> None:
        client = redis_queue.client
        for key in list(client.scan_iter(match=prefix.removesuffix("queue:") + "*", count=1000)):
            client.delete(key)

    cleanup.append(empty)
    return manager, empty


def measure(kind: str, ops: int, rounds: int) -> dict[str, float] | None:
    cleanup: list[Callable[[], None]] = []
    made = make(kind, cleanup)
    if made is None:
        print(f"{kind}: skipped (server does not answer)")
        return None
    manager, empty = made
    rainier_sync.set_instance(manager)
    try:
        backend = add.get_backend()
        job = job_class_for(add, backend.keep_result)
        manager.registry.register(job)

        perf = time.perf_counter

        def dispatching() -> float:
            started = perf()
            manager.dispatch(job(1, 2))
            return perf() - started

        def enqueueing() -> float:
            started = perf()
            add.enqueue(1, 2)
            return perf() - started

        for _ in range(20):  # warm-up
            dispatching(), enqueueing()
        empty()
        ratios: list[float] = []
        plain: list[float] = []
        tasked: list[float] = []
        for index in range(rounds):
            for op in range(ops):
                if (index + op) % 2:
                    d, e = dispatching(), enqueueing()
                else:
                    e, d = enqueueing(), dispatching()
                plain.append(d)
                tasked.append(e)
                ratios.append(e / d)
            empty()
        return {
            "dispatch_us": statistics.median(plain) * 1e6,
            "enqueue_us": statistics.median(tasked) * 1e6,
            "ratio": statistics.median(tasked) / statistics.median(plain),
            "pair_ratio": statistics.median(ratios),
        }
    finally:
        rainier_sync.set_instance(None)
        for step in cleanup:
            step()
        manager.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backends", default="sqlite,postgres,redis")
    options = parser.parse_args()
    print(f"django tasks via {FRAMEWORK} (Django {django.get_version()}); {options.rounds} rounds of {options.ops}")
    for kind in options.backends.split(","):
        found = measure(kind, options.ops, options.rounds)
        if found is not None:
            print(
                f"{kind:9} dispatch {found['dispatch_us']:8.1f} us   enqueue {found['enqueue_us']:8.1f} us   "
                f"ratio {found['ratio']:.3f} (median of pairs {found['pair_ratio']:.3f}; target <= 1.3)"
            )


if __name__ == "__main__":
    main()
