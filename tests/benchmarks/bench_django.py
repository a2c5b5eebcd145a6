"""Django integration benchmark: a Django-hosted worker against a plain one, on the same backend.

    .venv/bin/python tests/benchmarks/bench_django.py [--backend sqlite|postgresql] [--jobs 3000]
        [--threads 4] [--pairs 5] [--conn-max-age 60]

Django is set up in this process with one ``DATABASES`` alias (a fresh SQLite
file, or a fresh PostgreSQL database on ``TEST_POSTGRES_URL``, dropped at the
end) and ``RAINIER_QUEUES`` keeping the jobs there. Each pair fills the queue
with ``--jobs`` jobs and drains it (``once``, ``--threads`` threads) with a
plain :class:`~rainier_sync.Worker`, then fills it again and drains it with a
:class:`~rainier_sync.django.DjangoWorker` (``close_old_connections()``
around each attempt); the order alternates between pairs. Two kinds of job:
``noop`` (no query) and ``query`` (one ``SELECT 1`` on the thread's Django
connection). Printed: each side's median jobs/s and the median of the
pairs' ratios (Django / plain).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from rainier_sync import Job, JobContext, Worker, WorkerOptions


@dataclass
class Noop(Job):
    NAME = "bench.django.noop"
    n: int

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Query(Job):
    NAME = "bench.django.query"
    n: int

    def handle(self, context: JobContext) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()


def database(backend: str, conn_max_age: int) -> tuple[dict[str, Any], Any]:
    """A ``DATABASES['default']`` entry of a fresh database, and what drops it."""
    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="bench-django-")
        entry = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(folder, "bench.sqlite3")}
        return entry, lambda: None
    import psycopg

    base = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    parts = urllib.parse.urlsplit(base)
    name = f"rainier_bench_dj_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    entry = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        "USER": parts.username or "postgres",
        "PASSWORD": parts.password or "",
        "CONN_MAX_AGE": conn_max_age,
    }
    return entry, drop


def drain(manager: Any, worker_class: type[Worker], job: type[Job], jobs: int, threads: int) -> float:
    manager.dispatch_many(job(i) for i in range(jobs))  # type: ignore[call-arg]
    worker = worker_class(manager, options=WorkerOptions(once=True, concurrency=threads))
    started = time.perf_counter()
    stats = worker.run()
    elapsed = time.perf_counter() - started
    assert stats.processed == jobs, stats
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--conn-max-age", type=int, default=60)
    args = parser.parse_args()

    import django
    from django.conf import settings

    entry, drop = database(args.backend, args.conn_max_age)
    entry.setdefault("CONN_MAX_AGE", args.conn_max_age)
    settings.configure(
        DEBUG=False,
        INSTALLED_APPS=["rainier_sync.django"],
        DATABASES={"default": entry},
        RAINIER_QUEUES={"connections": {"main": {"driver": "database", "alias": "default"}}},
        RAINIER_JOBS=["__main__"],
        USE_TZ=True,
    )
    try:
        django.setup()
        from django.core.management import call_command

        from rainier_sync.django import DjangoWorker, get_manager

        call_command("migrate", verbosity=0)
        manager = get_manager()
        print(f"{args.backend}: {args.jobs} jobs per run, {args.threads} threads, {args.pairs} pairs, "
              f"CONN_MAX_AGE={entry['CONN_MAX_AGE']}")  # fmt: skip
        for job in (Noop, Query):
            plain: list[float] = []
            hosted: list[float] = []
            for pair in range(args.pairs):
                order = [(Worker, plain), (DjangoWorker, hosted)]
                for worker_class, rates in order if pair % 2 == 0 else reversed(order):
                    rates.append(drain(manager, worker_class, job, args.jobs, args.threads))
            ratio = statistics.median(h / p for h, p in zip(hosted, plain, strict=True))
            print(f"  {job.__name__.lower():<6} Worker {statistics.median(plain):8,.0f} jobs/s   "
                  f"DjangoWorker {statistics.median(hosted):8,.0f} jobs/s   ratio {ratio:.2f}")  # fmt: skip
        manager.close()
    finally:
        from django.db import connections

        connections.close_all()
        drop()


if __name__ == "__main__":
    main()
