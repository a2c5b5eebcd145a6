"""Lock stores (unique jobs, leases, middleware windows and counters, paused
queues): memory here; database and Redis load on demand."""

from __future__ import annotations

import importlib
from typing import Any

from .base import LockStore
from .memory import MemoryLockStore

__all__ = ["LockStore", "MemoryLockStore", "DatabaseLockStore", "RedisLockStore"]

_LAZY = {
    "DatabaseLockStore": "rainier_sync.locks.database",
    "RedisLockStore": "rainier_sync.locks.redis",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rainier_sync.locks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
