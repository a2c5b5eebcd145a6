"""The scheduler: dispatches the due ticks of a manager's :class:`~rainier_sync.Schedule`
(how each tick is dispatched exactly once: see :mod:`rainier_sync.schedule`)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from . import _clock
from .errors import ConfigurationError
from .schedule import HOLD_MARGIN, Entry

if TYPE_CHECKING:
    from .manager import QueueManager
    from .state.base import LockStore

__all__ = ["Scheduler"]

log = logging.getLogger("rainier_sync")


class Scheduler:
    """Dispatches the due ticks of a manager's schedule; one per scheduling worker or ``schedule:run``.

    :meth:`run_due` is cheap when nothing is due (one comparison per entry), and
    :attr:`next_due` says when to call it next.
    """

    def __init__(self, manager: QueueManager, connection: str | None = None) -> None:
        schedule = manager.schedule
        if schedule is None or not len(schedule):
            raise ConfigurationError("this manager has no schedule: give QueueManager schedule=Schedule()...")
        self.manager = manager
        self.locks: LockStore = manager._store("a schedule (each tick dispatched once)")
        self.connection = connection
        self.entries = list(schedule)
        #: Per entry: the next time it has a tick this scheduler has not handled.
        self._due: dict[str, float] = {entry.name: -math.inf for entry in self.entries}
        self.next_due = -math.inf
        #: Per entry: the last tick this scheduler dispatched or found taken.
        self.last: dict[str, float] = {}
        #: What this scheduler dispatched: (entry name, tick, job id), oldest first.
        self.dispatched: list[tuple[str, float, str]] = []

    def run_due(self, now: float | None = None) -> list[str]:
        """Dispatch every entry's latest due tick not yet dispatched; returns the new jobs' ids."""
        now = _clock.now() if now is None else now
        if now < self.next_due:
            return []
        sent: list[str] = []
        for entry in self.entries:
            if now < self._due[entry.name]:
                continue
            tick = entry.latest(now)
            if tick is not None and tick > self.last.get(entry.name, -math.inf):
                job_id = self._dispatch(entry, tick, entry.following(tick))
                if job_id is not None:
                    sent.append(job_id)
                self.last[entry.name] = tick
            self._due[entry.name] = entry.following(now if tick is None else tick)
        self.next_due = min(self._due.values(), default=math.inf)
        return sent

    def _dispatch(self, entry: Entry, tick: float, following: float) -> str | None:
        key = entry.key(tick)
        if self.locks.owner(key) is not None:
            return None  # another scheduler dispatched it
        hold = max(following - tick, 0.0) + HOLD_MARGIN
        queued = self.manager.build(entry.job, connection=self.connection)
        queued.meta = {"tick": key, "once": key, "hold": hold}
        [job_id] = self.manager.send_queued(self.connection, [queued])
        if job_id is None:
            self.locks.acquire(key, "unique-duplicate", hold)
            return None
        self.locks.acquire(key, job_id, hold)
        self.dispatched.append((entry.name, tick, job_id))
        log.info("schedule: %s dispatched its tick of %s as job %s", entry.name, key.split(":", 2)[2], job_id)
        return job_id

    def holder(self, entry: Entry, now: float | None = None) -> tuple[float, str] | None:
        """The entry's latest tick at or before ``now`` and the job that holds it, if one does."""
        tick = entry.latest(_clock.now() if now is None else now)
        if tick is None:
            return None
        owner = self.locks.owner(entry.key(tick))
        return None if owner is None else (tick, owner)
