"""The coordination state every process that dispatches or works shares: the
store's protocols (:mod:`.base`) and the store in this process's memory
(:mod:`.memory`). The Redis and database stores live beside their queues."""

from __future__ import annotations

from .base import STORE_HINT, Counters, Locks, LockStore, StateStore, Tallies, Values, Windows
from .memory import MemoryLockStore

__all__ = [
    "Locks",
    "Windows",
    "Counters",
    "Values",
    "Tallies",
    "StateStore",
    "LockStore",
    "MemoryLockStore",
    "STORE_HINT",
]
