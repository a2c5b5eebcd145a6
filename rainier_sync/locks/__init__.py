"""The stores of the coordination state, by their public names: the protocols
and the memory store in :mod:`rainier_sync.state`, the Redis and database
stores beside their queues. Each loads on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..coordination import store_of as store_of
    from ..drivers.database.store import DatabaseLockStore as DatabaseLockStore
    from ..drivers.redis.store import RedisLockStore as RedisLockStore
    from ..drivers.redis.store import lock_prefix as lock_prefix
    from ..state.base import LockStore as LockStore
    from ..state.memory import MemoryLockStore as MemoryLockStore

__all__ = ["LockStore", "MemoryLockStore", "DatabaseLockStore", "RedisLockStore", "store_of", "lock_prefix"]

_WHERE = {
    "LockStore": "rainier_sync.state.base",
    "MemoryLockStore": "rainier_sync.state.memory",
    "DatabaseLockStore": "rainier_sync.drivers.database.store",
    "RedisLockStore": "rainier_sync.drivers.redis.store",
    "store_of": "rainier_sync.coordination",
    "lock_prefix": "rainier_sync.drivers.redis.store",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rainier_sync.locks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
