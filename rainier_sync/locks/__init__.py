"""Lock stores (unique jobs, leases, middleware windows and counters, paused
queues, batches, results, the fleet's records): memory here; database and Redis
load on demand. :func:`store_of` is the store a manager defaults to."""

from __future__ import annotations

import importlib
import weakref
from typing import TYPE_CHECKING, Any

from .base import LockStore
from .memory import MemoryLockStore

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue

__all__ = ["LockStore", "MemoryLockStore", "DatabaseLockStore", "RedisLockStore", "store_of", "lock_prefix"]

_LAZY = {
    "DatabaseLockStore": "rainier_sync.locks.database",
    "RedisLockStore": "rainier_sync.locks.redis",
}

#: One memory store per memory queue: every manager over that queue sees the same state.
_memory_stores: weakref.WeakKeyDictionary[Any, MemoryLockStore] = weakref.WeakKeyDictionary()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rainier_sync.locks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def store_of(driver: BaseQueue) -> LockStore | None:
    """The lock store in ``driver``'s own backend, which a manager whose default
    connection it is uses when given no ``locks=``; None where the backend cannot
    hold one (SQS, sync).

    A memory queue: a :class:`MemoryLockStore` (the same one for every manager
    over that queue). A database queue (and any driver with a ``lock_store()``
    method): ``driver.lock_store()``, a :class:`DatabaseLockStore` on the queue's
    own connection (its tables come with the queue's migrations). A Redis queue: a
    :class:`RedisLockStore` on the queue's own client (server, database, Sentinel
    or cluster) and reconnect settings, under the queue's prefix with its last
    ``queue:`` made ``lock:`` (``rainier:queue:`` gives ``rainier:lock:``, the
    store's own default), or ``lock:`` added to a prefix that has none. A Kafka
    queue: the lock store it keeps its leases in."""
    from ..drivers.base import QueueDriver

    own = getattr(driver, "lock_store", None)
    if callable(own):
        store = own()
        return store if isinstance(store, LockStore) else None
    kind = driver.driver
    if kind is QueueDriver.MEMORY:
        found = _memory_stores.get(driver)
        if found is None:
            found = _memory_stores[driver] = MemoryLockStore()
        return found
    if kind is QueueDriver.REDIS:
        from ..drivers.redis.queue import RedisQueue
        from .redis import RedisLockStore

        if not isinstance(driver, RedisQueue):
            return None
        # The queue's own topology: the same client, so the queue counts batches in
        # its acknowledgements (see drivers/redis/counting.py), and no second pool.
        store = RedisLockStore(driver._topology, prefix=lock_prefix(driver.prefix))
        store._policy = driver._policy
        return store
    if kind is QueueDriver.KAFKA:
        leases = getattr(driver, "locks", None)
        return leases if isinstance(leases, LockStore) else None
    return None


def lock_prefix(queue_prefix: str) -> str:
    """The prefix of the lock store a Redis queue with ``queue_prefix`` defaults to."""
    head, found, tail = queue_prefix.rpartition("queue:")
    if found and not tail:
        return head + "lock:"
    return queue_prefix + "lock:"
