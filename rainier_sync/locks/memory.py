"""A lock store in this process's memory: for tests and single-process apps."""

from __future__ import annotations

import threading

from .. import _clock
from .base import LockStore

__all__ = ["MemoryLockStore"]


class MemoryLockStore(LockStore):
    """Locks that only this process sees. Expiry follows :func:`rainier_sync._clock.now`,
    so freezegun moves it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[str, float]] = {}
        self._mutex = threading.Lock()

    def _live(self, key: str, now: float) -> tuple[str, float] | None:
        held = self._locks.get(key)
        if held is not None and held[1] <= now:
            del self._locks[key]
            return None
        return held

    def acquire(self, key: str, owner: str, ttl: float) -> bool:
        now = _clock.now()
        with self._mutex:
            if self._live(key, now) is not None:
                return False
            self._locks[key] = (owner, now + ttl)
            return True

    def release(self, key: str, owner: str) -> bool:
        with self._mutex:
            held = self._live(key, _clock.now())
            if held is None or held[0] != owner:
                return False
            del self._locks[key]
            return True

    def renew(self, key: str, owner: str, ttl: float) -> bool:
        now = _clock.now()
        with self._mutex:
            held = self._live(key, now)
            if held is None or held[0] != owner:
                return False
            self._locks[key] = (owner, now + ttl)
            return True

    def owner(self, key: str) -> str | None:
        with self._mutex:
            held = self._live(key, _clock.now())
            return held[0] if held else None
