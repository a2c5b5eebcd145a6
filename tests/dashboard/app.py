"""The app ``rainier-sync dashboard --app tests.dashboard.app:manager`` serves in
the tests: one connection, ``main``, on the backend ``DASHBOARD_QUEUE_URL``
names (a SQLite file, or Redis under ``DASHBOARD_REDIS_PREFIX``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager
from rainier_sync.drivers.base import BaseQueue


@dataclass
class Explode(Job):
    """Always fails, with whatever message it carries."""

    NAME = "tests.dashboard.explode"
    QUEUE = "mail"

    message: str

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(self.message)


def driver(url: str, prefix: str | None = None) -> BaseQueue:
    """The driver of ``url``: SQLite (migrated) or Redis under ``prefix``."""
    if url.startswith("sqlite"):
        from rainier_sync.drivers.database import DatabaseQueue

        queue = DatabaseQueue.from_url(url, reservation=30)
        queue.migrate()
        return queue
    from rainier_sync.drivers import RedisQueue

    return RedisQueue.from_url(url, prefix=prefix or "rsdash:", reservation=30)


def build(queue: BaseQueue) -> QueueManager:
    return QueueManager(connections={"main": queue}, registry=JobRegistry().with_job(Explode), container=Container())


def manager() -> QueueManager:
    """The served manager (a factory: ``--app`` calls it)."""
    return build(driver(os.environ["DASHBOARD_QUEUE_URL"], os.environ.get("DASHBOARD_REDIS_PREFIX")))
