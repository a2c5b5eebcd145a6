"""The store in this process's memory: for tests and single-process apps."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from .. import _clock
from .base import StateStore, take_from

__all__ = ["MemoryLockStore"]


class MemoryLockStore(StateStore):
    """Locks that only this process sees. Expiry follows :func:`rainier_sync._clock.now`,
    so freezegun moves it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[str, float]] = {}
        #: A window's batches of starts: (stamp, how many).
        self._windows: dict[str, list[tuple[float, int]]] = {}
        self._counts: dict[str, tuple[int, float]] = {}
        self._flags: dict[str, set[str]] = {}
        self._values: dict[str, tuple[str, float]] = {}
        self._tallies: dict[str, tuple[dict[str, int], set[str], float]] = {}
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)

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

    def take(self, key: str, limit: int, per: float) -> float:
        taken, rooms = self.take_many(key, 1, limit, per)
        return 0.0 if taken else rooms[0]

    def take_many(self, key: str, n: int, limit: int, per: float, hold: float = 0.0) -> tuple[int, list[float]]:
        with self._mutex:
            now = _clock.now()
            kept, taken, rooms = take_from(self._windows.get(key, []), n, limit, per, now, now + hold)
            self._windows[key] = kept
            return taken, rooms

    def count(self, key: str, window: float) -> int:
        now = _clock.now()
        with self._mutex:
            held, until = self._counts.get(key, (0, 0.0))
            held = held + 1 if until > now else 1
            self._counts[key] = (held, now + window)
            return held

    def counted(self, key: str) -> tuple[int, float]:
        with self._mutex:
            held, until = self._counts.get(key, (0, 0.0))
            return (held, until) if until > _clock.now() else (0, 0.0)

    def reset(self, key: str) -> None:
        with self._mutex:
            self._counts.pop(key, None)

    def set_flag(self, group: str, member: str, on: bool) -> None:
        with self._mutex:
            members = self._flags.setdefault(group, set())
            if on:
                members.add(member)
            else:
                members.discard(member)

    def flags(self, group: str) -> set[str]:
        with self._mutex:
            return set(self._flags.get(group, ()))

    def put_value(self, key: str, value: str, ttl: float) -> None:
        with self._mutex:
            self._values[key] = (value, _clock.now() + float(ttl))
            self._changed.notify_all()

    def get_value(self, key: str) -> str | None:
        with self._mutex:
            return self._live_value(key)

    def _live_value(self, key: str) -> str | None:
        held = self._values.get(key)
        if held is None or held[1] <= _clock.now():
            return None
        return held[0]

    def wait_value(self, key: str, timeout: float, done: Callable[[str | None], bool]) -> str | None:
        deadline = _clock.monotonic() + max(0.0, timeout)
        with self._mutex:
            while True:
                value = self._live_value(key)
                left = deadline - _clock.monotonic()
                if done(value) or left <= 0:
                    return value
                self._changed.wait(min(left, 1.0))

    def _tally(self, key: str, ttl: float) -> tuple[dict[str, int], set[str]]:
        held = self._tallies.get(key)
        now = _clock.now()
        counts, members = (held[0], held[1]) if held is not None and held[2] > now else ({}, set())
        self._tallies[key] = (counts, members, now + float(ttl))
        return counts, members

    def tally_add(self, key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        with self._mutex:
            held, _ = self._tally(key, ttl)
            for field, n in counts.items():
                held[field] = held.get(field, 0) + int(n)
            return dict(held)

    def tally_settle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        with self._mutex:
            held, members = self._tally(key, ttl)
            new = member not in members
            if new:
                members.add(member)
                held[field] = held.get(field, 0) + 1
                held["pending"] = held.get("pending", 0) - 1
            return dict(held), new

    def tally_settle_many(self, items: Sequence[tuple[str, str, str, float]]) -> list[tuple[dict[str, int], bool]]:
        with self._mutex:
            news: list[bool] = []
            for key, member, field, ttl in items:
                held, members = self._tally(key, ttl)
                new = member not in members
                if new:
                    members.add(member)
                    held[field] = held.get(field, 0) + 1
                    held["pending"] = held.get("pending", 0) - 1
                news.append(new)
            return [(dict(self._tallies[key][0]), new) for (key, _, _, _), new in zip(items, news, strict=True)]

    def tally_unsettle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        with self._mutex:
            held, members = self._tally(key, ttl)
            there = member in members
            if there:
                members.discard(member)
                held[field] = held.get(field, 0) - 1
                held["pending"] = held.get("pending", 0) + 1
            return dict(held), there

    def tally(self, key: str) -> dict[str, int] | None:
        with self._mutex:
            held = self._tallies.get(key)
            return dict(held[0]) if held is not None and held[2] > _clock.now() else None
