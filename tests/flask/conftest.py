from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import rainier_sync

from .apps import SEEN, SEEN_LOCK


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    """Booting from config sets the process-wide manager: put it back after each test."""
    previous = rainier_sync.set_instance(None)
    with SEEN_LOCK:
        SEEN.clear()
    yield
    rainier_sync.set_instance(previous)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Any]:
    """A driver on a real server (SQLite, PostgreSQL in a schema of its own, Redis under a key prefix), emptied."""
    if request.param == "sqlite":
        from rainier_sync.drivers.database import DatabaseQueue

        queue = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", reservation=30)
        queue.migrate()
        yield queue
        queue.close()
    elif request.param == "postgres":
        from rainier_sync.drivers.database import DatabaseQueue
        from tests.drivers.database.support import postgres_schema_url

        queue = DatabaseQueue.from_url(postgres_schema_url(request), reservation=30)
        queue._backend.execute("TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks")
        yield queue
        queue.close()
    else:
        from rainier_sync.drivers import RedisQueue

        prefix = f"rsflask:{uuid.uuid4().hex[:12]}:"
        redis_queue = RedisQueue.from_url(request.getfixturevalue("redis_url"), prefix=prefix, reservation=30)
        yield redis_queue
        keys = list(redis_queue.client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            redis_queue.client.delete(*keys)
        redis_queue.close()
