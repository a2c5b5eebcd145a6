"""rainier_sync on its Redis driver and its database driver (PostgreSQL, SQLite).

Workers: ``rainier-sync queue:work --app adapters.peer_rainier:<backend>_manager --concurrency C -q``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.base import Adapter, Settings, record_run, script
from rainier_sync import Job, JobContext, JobRegistry, QueueManager


@dataclass
class Noop(Job):
    NAME = "peers.noop"

    index: int = 0

    def handle(self, context: JobContext) -> None:
        record_run(self.index)


REGISTRY = JobRegistry().with_job(Noop)


def sqlite_url(settings: Settings) -> str:
    return "sqlite:///" + os.path.join(settings.sqlite_dir, "rainier.db")


def redis_manager() -> QueueManager:
    from rainier_sync.drivers.redis import RedisQueue

    return QueueManager({"redis": RedisQueue.from_url(Settings.from_env().redis_url)}, registry=REGISTRY)


def postgres_manager() -> QueueManager:
    from rainier_sync.drivers.database import DatabaseQueue

    return QueueManager({"postgres": DatabaseQueue.from_url(Settings.from_env().pg_dsn)}, registry=REGISTRY)


def sqlite_manager() -> QueueManager:
    from rainier_sync.drivers.database import DatabaseQueue

    return QueueManager({"sqlite": DatabaseQueue.from_url(sqlite_url(Settings.from_env()))}, registry=REGISTRY)


class RainierRedisAdapter(Adapter):
    name = "rainier-redis"
    library = "rainier_sync"
    backend = "redis"
    job_module = "adapters.peer_rainier"
    batch_api = "manager.dispatch_many([...])"
    factory = "redis_manager"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.manager: QueueManager | None = None

    def migrate(self) -> None:
        pass

    def prepare(self) -> None:
        self.migrate()

    def reset(self) -> None:
        if self.manager is not None:
            self.manager.close()
        self.manager = globals()[self.factory]()

    def worker_commands(self) -> list[list[str]]:
        app = f"--app={self.job_module}:{self.factory}"
        return [script("rainier-sync", "queue:work", app, f"--concurrency={self.settings.concurrency}", "-q")]

    def enqueue_one(self, index: int) -> None:
        assert self.manager is not None
        self.manager.dispatch(Noop(index))

    def enqueue_many(self, indices: Sequence[int]) -> None:
        assert self.manager is not None
        self.manager.dispatch_many([Noop(index) for index in indices])

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


class RainierDatabaseAdapter(RainierRedisAdapter):
    """The database driver: tables migrated once, emptied before each sample."""

    def url(self) -> str:
        raise NotImplementedError

    def migrate(self) -> None:
        from rainier_sync.drivers.database import DatabaseQueue

        queue = DatabaseQueue.from_url(self.url())
        queue.migrate()
        queue.close()

    def reset(self) -> None:
        self.empty_tables()
        super().reset()

    def empty_tables(self) -> None:
        raise NotImplementedError


class RainierPostgresAdapter(RainierDatabaseAdapter):
    name = "rainier-postgres"
    backend = "postgres"
    factory = "postgres_manager"

    def url(self) -> str:
        return self.settings.pg_dsn

    def empty_tables(self) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " AND tablename LIKE 'rainier%%' AND tablename <> 'rainier_migrations'"
            ).fetchall()
            conn.execute("TRUNCATE " + ", ".join(f'"{name}"' for (name,) in rows))


class RainierSqliteAdapter(RainierDatabaseAdapter):
    name = "rainier-sqlite"
    backend = "sqlite"
    factory = "sqlite_manager"

    def url(self) -> str:
        return sqlite_url(self.settings)

    def empty_tables(self) -> None:
        import sqlite3

        with contextlib.closing(sqlite3.connect(os.path.join(self.settings.sqlite_dir, "rainier.db"))) as conn:
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name LIKE 'rainier%' AND name <> 'rainier_migrations'"
            ).fetchall()
            with conn:
                for (name,) in rows:
                    conn.execute(f'DELETE FROM "{name}"')
