"""The coordination state every process that dispatches or works shares, as a
few small protocols: :class:`Locks` (unique jobs, Kafka's leases, guards),
:class:`Windows` (job middleware's sliding windows of starts), :class:`Counters`
(counters and flags: middleware's counts, paused queues), :class:`Values` (kept
results, the workers' records) and :class:`Tallies` (batches' counts, the
workers' counts per minute). :class:`StateStore` is all of them, the one a
manager takes as ``locks=``; ``LockStore`` is its other name."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Callable, Sequence

from .. import _clock
from ..errors import CapabilityError

__all__ = [
    "Locks",
    "Windows",
    "Counters",
    "Values",
    "Tallies",
    "StateStore",
    "LockStore",
    "STORE_HINT",
    "ROOMS",
    "take_from",
    "rooms_of",
    "last_counts",
]

#: What to write where a store is needed and none was given.
STORE_HINT = "give QueueManager locks= (a RedisLockStore or DatabaseLockStore every worker shares)"

#: The most rooms :meth:`Windows.take_many` reports of a full window.
ROOMS = 64


class _Part:
    """What every protocol of the store shares: how it says it cannot."""

    def _cannot(self, what: str) -> CapabilityError:
        return CapabilityError(f"{type(self).__name__} cannot {what}")


class Locks(_Part, ABC):
    """Atomic, expiring locks.

    ``owner`` is a random token: only the owner releases or renews its lock,
    so a lock that expired and was taken by someone else is never released by
    the first holder.
    """

    @abstractmethod
    def acquire(self, key: str, owner: str, ttl: float) -> bool:
        """Take ``key`` for ``ttl`` seconds if nobody holds it; True when taken."""

    @abstractmethod
    def release(self, key: str, owner: str) -> bool:
        """Drop ``key`` if ``owner`` still holds it; True when dropped."""

    @abstractmethod
    def renew(self, key: str, owner: str, ttl: float) -> bool:
        """Extend ``owner``'s hold on ``key`` to ``ttl`` seconds from now; False if lost."""

    @abstractmethod
    def owner(self, key: str) -> str | None:
        """Who holds ``key`` now, or None."""

    def acquire_many(self, items: Sequence[tuple[str, str]], ttl: float) -> list[bool]:
        """:meth:`acquire` for several ``(key, owner)`` pairs, in one round trip
        where the store allows; a result per pair, in order."""
        return [self.acquire(key, owner, ttl) for key, owner in items]

    def renew_many(self, items: Sequence[tuple[str, str]], ttl: float) -> list[bool]:
        """:meth:`renew` for several ``(key, owner)`` pairs; a result per pair, in order."""
        return [self.renew(key, owner, ttl) for key, owner in items]


class Windows(_Part):
    """Sliding windows of starts (``RateLimited``)."""

    def take(self, key: str, limit: int, per: float) -> float:
        """A sliding window of starts: when fewer than ``limit`` were counted under
        ``key`` in the last ``per`` seconds, count one more and return 0.0; else
        count nothing and return the seconds until the oldest leaves the window."""
        raise self._cannot("count starts in a sliding window (take)")

    def take_many(self, key: str, n: int, limit: int, per: float, hold: float = 0.0) -> tuple[int, list[float]]:
        """Up to ``n`` starts from the window under ``key`` at once (as many as it
        has room for), counted as if made ``hold`` seconds from now, so that they
        stay in the window until ``hold + per`` from now. Returns how many were
        taken and, when the window is left full, the seconds until each of its
        next rooms (at most :data:`ROOMS` of them; empty while it has room).

        A store that cannot take several at once inherits this: one start, by
        :meth:`take`, and only with ``hold`` 0."""
        if hold:
            raise self._cannot("take starts ahead (take_many with a hold)")
        wait = self.take(key, limit, per)
        return (1, []) if wait <= 0 else (0, [wait])


class Counters(_Part):
    """Counters that lapse, and groups of flags (job middleware's counts, paused queues,
    the workers' presence)."""

    def count(self, key: str, window: float) -> int:
        """Count one event under ``key``; the count lapses ``window`` seconds after
        its latest event. Returns the count with this one."""
        raise self._cannot("count events (count)")

    def counted(self, key: str) -> tuple[int, float]:
        """The count under ``key`` and when (seconds since the epoch) it lapses;
        ``(0, 0.0)`` when there is none."""
        raise self._cannot("read a count (counted)")

    def reset(self, key: str) -> None:
        """Forget the count under ``key``."""
        raise self._cannot("reset a count (reset)")

    def set_flag(self, group: str, member: str, on: bool) -> None:
        """Raise (``on``) or lower ``member``'s flag in ``group``."""
        raise self._cannot("keep flags (set_flag)")

    def flags(self, group: str) -> set[str]:
        """The members of ``group`` whose flags are raised."""
        raise self._cannot("keep flags (flags)")


class Values(_Part):
    """Values kept for a time, and waits for them (kept results, the workers' records)."""

    def put_value(self, key: str, value: str, ttl: float) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds, replacing what was there,
        and wake whoever waits for it."""
        raise self._cannot("keep values (put_value)")

    def get_value(self, key: str) -> str | None:
        """The value under ``key``, or None when there is none (or it expired)."""
        raise self._cannot("keep values (get_value)")

    def wait_value(self, key: str, timeout: float, done: Callable[[str | None], bool]) -> str | None:
        """Wait up to ``timeout`` seconds until ``done(value)`` holds for the value
        under ``key``; returns the last value read. This default polls, from 2 ms
        up to 50 ms between reads; a store that can be woken overrides it."""
        deadline = _clock.monotonic() + max(0.0, timeout)
        pause = 0.002
        while True:
            value = self.get_value(key)
            left = deadline - _clock.monotonic()
            if done(value) or left <= 0:
                return value
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, 0.05)


class Tallies(_Part):
    """Named counts that settle once per member (a batch's counts, the workers' counts per minute)."""

    def tally_add(self, key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        """Add ``counts`` to the named counts under ``key``, all at once; they
        are kept ``ttl`` seconds from now. Returns every count under ``key``."""
        raise self._cannot("keep tallies (tally_add)")

    def tally_settle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        """Once per ``member``: add one to ``field`` and take one from ``pending``,
        all at once. Returns every count, and whether ``member`` was new (a
        member seen before changes nothing)."""
        raise self._cannot("keep tallies (tally_settle)")

    def tally_settle_many(self, items: Sequence[tuple[str, str, str, float]]) -> list[tuple[dict[str, int], bool]]:
        """:meth:`tally_settle` for several ``(key, member, field, ttl)`` items, in
        one round trip where the store allows. For each item, in order: every
        count under its key once all the items were settled, and whether its
        member was new. This default settles them one by one."""
        settled = [self.tally_settle(key, member, field, ttl) for key, member, field, ttl in items]
        return last_counts(items, settled)

    def tally_unsettle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        """Undo :meth:`tally_settle` of ``member``, all at once: when ``member`` was
        settled, forget it (so it settles again), take one from ``field`` and add
        one to ``pending``. Returns every count, and whether ``member`` was there
        (a member not there changes nothing). A batch's retried job goes back to
        pending so."""
        raise self._cannot("keep tallies (tally_unsettle)")

    def tally(self, key: str) -> dict[str, int] | None:
        """The counts under ``key``, or None when there are none."""
        raise self._cannot("keep tallies (tally)")


class StateStore(Locks, Windows, Counters, Values, Tallies):
    """The coordination state shared by every process that dispatches or works:
    every protocol at once, the store a manager takes as ``locks=``. A store
    implements the locks and inherits, for whatever else it cannot keep, a
    method that raises :class:`~rainier_sync.errors.CapabilityError`."""

    def prune(self) -> int:
        """Delete what has expired, where the store does not on its own; how many went."""
        return 0

    def close(self) -> None:
        """Release connections."""


#: The combined protocol's other name, the one ``QueueManager(locks=...)`` was given first.
LockStore = StateStore


def last_counts(
    items: Sequence[tuple[str, str, str, float]], settled: Sequence[tuple[dict[str, int], bool]]
) -> list[tuple[dict[str, int], bool]]:
    """Each item's key's counts as the last item of that key left them."""
    last = {item[0]: counts for item, (counts, _) in zip(items, settled, strict=True)}
    return [(dict(last[item[0]]), new) for item, (_, new) in zip(items, settled, strict=True)]


# -- the sliding window's arithmetic, shared by the stores that keep it in this process's terms
def take_from(
    batches: list[tuple[float, int]], n: int, limit: int, per: float, now: float, stamp: float
) -> tuple[list[tuple[float, int]], int, list[float]]:
    """A window's ``(stamp, count)`` batches after taking up to ``n`` starts
    stamped ``stamp`` at ``now``: the batches still inside it with the new one,
    how many were taken, and its rooms (:func:`rooms_of`)."""
    kept = [(at, count) for at, count in batches if at > now - per and count > 0]
    taken = max(0, min(n, limit - sum(count for _, count in kept)))
    if taken:
        kept.append((stamp, taken))
    return kept, taken, rooms_of(kept, limit, per, now)


def rooms_of(batches: list[tuple[float, int]], limit: int, per: float, now: float) -> list[float]:
    """When a window holding ``batches`` is full, the seconds from ``now`` until
    each of its next :data:`ROOMS` rooms (a start leaving it that brings it
    below ``limit``); empty when it has room now."""
    skip = sum(count for _, count in batches) - limit
    if skip < 0:
        return []
    rooms: list[float] = []
    for at, count in sorted(batches):
        if skip >= count:
            skip -= count
            continue
        count, skip = count - skip, 0
        rooms.extend([max(0.0, at + per - now)] * min(count, ROOMS - len(rooms)))
        if len(rooms) >= ROOMS:
            break
    return rooms
