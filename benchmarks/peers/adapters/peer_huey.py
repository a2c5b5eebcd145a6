"""Huey on Redis and on SQLite: ``huey_consumer adapters.peer_huey.<instance> -w C -k thread``.

Huey has no batch enqueue (``Task.map()`` enqueues one message per item).
"""

from __future__ import annotations

import os

from huey import RedisHuey, SqliteHuey

from adapters.base import Adapter, Settings, record_run, script

_settings = Settings.from_env()
redis_huey = RedisHuey("peers", url=_settings.redis_url)
sqlite_huey = SqliteHuey("peers", filename=os.path.join(_settings.sqlite_dir, "huey.db"))


@redis_huey.task()
def redis_noop(index: int) -> None:
    record_run(index)


@sqlite_huey.task()
def sqlite_noop(index: int) -> None:
    record_run(index)


class HueyRedisAdapter(Adapter):
    name = "huey-redis"
    library = "huey"
    backend = "redis"
    job_module = "adapters.peer_huey"
    instance = "redis_huey"

    def worker_commands(self) -> list[list[str]]:
        workers = str(self.settings.concurrency)
        return [script("huey_consumer", f"{self.job_module}.{self.instance}", "-w", workers, "-k", "thread", "-q")]

    def reset(self) -> None:
        redis_huey.flush()

    def enqueue_one(self, index: int) -> None:
        redis_noop(index)


class HueySqliteAdapter(HueyRedisAdapter):
    name = "huey-sqlite"
    backend = "sqlite"
    instance = "sqlite_huey"

    def reset(self) -> None:
        sqlite_huey.flush()

    def enqueue_one(self, index: int) -> None:
        sqlite_noop(index)
