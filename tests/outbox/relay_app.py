"""The application an ``outbox:relay`` process of the tests boots
(``--app tests.outbox.relay_app:make_manager``): a Redis connection ``fast``
and the outbox, from ``OUTBOX_URL``, ``REDIS_URL``, ``REDIS_PREFIX`` and
``OUTBOX_LEASE`` (seconds, for SQLite)."""

from __future__ import annotations

import os

from rainier_sync import QueueManager
from rainier_sync.drivers import RedisQueue
from rainier_sync.outbox import Outbox

from .jobs import registry


def make_manager() -> QueueManager:
    redis = RedisQueue.from_url(os.environ["REDIS_URL"], prefix=os.environ["REDIS_PREFIX"])
    outbox = Outbox.from_url(os.environ["OUTBOX_URL"], lease=float(os.environ.get("OUTBOX_LEASE", "30")))
    return QueueManager(connections={"fast": redis}, registry=registry(), outbox=outbox)


def without_outbox() -> QueueManager:
    """The same connection, and no outbox."""
    redis = RedisQueue.from_url(os.environ["REDIS_URL"], prefix=os.environ["REDIS_PREFIX"])
    return QueueManager(connections={"fast": redis}, registry=registry())
