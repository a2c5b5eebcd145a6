"""The application an ``outbox:relay`` process of the tests boots
(``--app tests.outbox.relay_app:make_manager``): a Redis connection ``fast``
and the outbox, from ``OUTBOX_URL``, ``REDIS_URL``, ``REDIS_PREFIX`` and
``OUTBOX_LEASE`` (seconds, for SQLite). With ``RELAY_KILL_AFTER_PUSH=k`` the
Redis connection kills its own process with SIGKILL right after its k-th push,
before the relay can delete the rows it pushed."""

from __future__ import annotations

import os
import signal
from typing import Sequence

from rainier_sync import QueueManager
from rainier_sync.drivers import RedisQueue
from rainier_sync.outbox import Outbox
from rainier_sync.types import QueuedJob

from .jobs import registry


class KilledAfterPush(RedisQueue):
    """Dies (SIGKILL) right after push number ``kill_after``: the relay has published
    that batch and not yet deleted it."""

    kill_after = 0
    pushes = 0

    def push(self, job: QueuedJob) -> str:
        job_id = super().push(job)
        self._pushed()
        return job_id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        ids = super().push_many(jobs)
        self._pushed()
        return ids

    def _pushed(self) -> None:
        self.pushes += 1
        if self.pushes == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)


def make_manager() -> QueueManager:
    kill_after = int(os.environ.get("RELAY_KILL_AFTER_PUSH", "0"))
    cls = KilledAfterPush if kill_after else RedisQueue
    redis = cls.from_url(os.environ["REDIS_URL"], prefix=os.environ["REDIS_PREFIX"])
    if isinstance(redis, KilledAfterPush):
        redis.kill_after = kill_after
    outbox = Outbox.from_url(os.environ["OUTBOX_URL"], lease=float(os.environ.get("OUTBOX_LEASE", "30")))
    return QueueManager(connections={"fast": redis}, registry=registry(), outbox=outbox)


def without_outbox() -> QueueManager:
    """The same connection, and no outbox."""
    redis = RedisQueue.from_url(os.environ["REDIS_URL"], prefix=os.environ["REDIS_PREFIX"])
    return QueueManager(connections={"fast": redis}, registry=registry())
