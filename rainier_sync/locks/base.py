"""The lock-store port used by unique jobs (and Kafka's job leases)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

__all__ = ["LockStore"]


class LockStore(ABC):
    """Atomic, expiring locks shared by every process that dispatches or works.

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

    def close(self) -> None:
        """Release connections."""
