"""Periodic jobs: cron entries and intervals, each tick dispatched exactly once.

A :class:`Schedule` lists entries; a :class:`~rainier_sync.scheduler.Scheduler`
in a scheduling worker (``WorkerOptions(schedule=True)``,
``queue:work --schedule``) or ``rainier-sync schedule:run`` dispatches each
entry's latest tick that is due. Ticks missed while nothing ran are not made
up: only the latest is dispatched.

Exactly once, across any number of schedulers sharing the lock store: a tick
is the key ``schedule:<entry>:<tick time>``. A scheduler that finds the key
free dispatches the job carrying the key (``QueuedJob.meta``), then claims the
key with the job's id as owner. When the job runs, it runs only if the key is
its own, or free (then it claims it); a job whose key another copy holds is
skipped. So a crash between the dispatch and the claim loses nothing (the job
claims its tick itself), and two schedulers racing on one tick dispatch two
copies of which one runs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ._checks import check_number
from .errors import ConfigurationError
from .once import OnceGuard

if TYPE_CHECKING:
    from .jobs import Job

__all__ = ["Schedule", "Entry", "TickGuard", "HOLD_MARGIN"]

log = logging.getLogger("rainier_sync")

#: How long past the entry's next tick a tick's key is held: while a tick is the
#: latest one, every scheduler finds it taken.
HOLD_MARGIN = 3600.0


@dataclass
class Entry:
    """One periodic job: a cron expression in a time zone, or a fixed interval."""

    name: str
    job: Job
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    _zone: Any = field(default=None, repr=False)

    def latest(self, now: float) -> float | None:
        """The latest tick at or before ``now`` (seconds since the epoch), or None."""
        if self.every is not None:
            return math.floor(now / self.every) * self.every
        from cronsim import CronSim

        moment = datetime.fromtimestamp(now, tz=self._zone) + timedelta(microseconds=1)
        try:
            return next(CronSim(self.cron or "", moment, reverse=True)).timestamp()
        except StopIteration:
            return None

    def following(self, tick: float) -> float:
        """The first tick after ``tick``."""
        if self.every is not None:
            return (math.floor(tick / self.every) + 1) * self.every
        from cronsim import CronSim

        try:
            return next(CronSim(self.cron or "", datetime.fromtimestamp(tick, tz=self._zone))).timestamp()
        except StopIteration:
            return math.inf

    @property
    def zone(self) -> Any:
        """The entry's time zone (a ``zoneinfo.ZoneInfo``; UTC for an interval)."""
        return self._zone

    def key(self, tick: float) -> str:
        """The lock-store key of one tick."""
        return f"schedule:{self.name}:{datetime.fromtimestamp(tick, tz=timezone.utc).isoformat()}"

    def describe(self) -> str:
        if self.every is not None:
            return f"every {self.every:g}s"
        return f"cron {self.cron!r} ({self.tz})"


class Schedule:
    """The periodic jobs of an app: ``Schedule().cron("*/5 * * * *", Prune()).every(30, Ping())``.

    Each entry is checked when it is added: a bad cron field, an unknown time
    zone, an interval that is not a positive number of seconds or a duplicate
    name raise :class:`~rainier_sync.ConfigurationError` naming it. Names default
    to the job's ``NAME``.
    """

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def cron(self, expr: str, job: Job, name: str | None = None, tz: str = "UTC") -> Schedule:
        """Dispatch ``job`` at the times of the five-field cron ``expr``, read in time zone ``tz``.

        Daylight-saving changes follow cronsim: a time that a spring-forward gap
        skips runs once, at the first valid time after it; a time an autumn
        repeat shows twice runs once, at its first occurrence.
        """
        entry = self._entry(job, name)
        if not isinstance(expr, str) or len(expr.split()) != 5:
            raise ConfigurationError(
                f"schedule entry {entry.name!r}: cron expression {expr!r} must have five fields "
                "(minute hour day-of-month month day-of-week)"
            )
        try:
            from cronsim import CronSim, CronSimError
        except ImportError:  # pragma: no cover - exercised only without the extra
            raise ConfigurationError("cron entries need cronsim: pip install 'rainier_sync[schedule]'") from None
        zone = _zone(entry.name, tz)
        try:
            CronSim(expr, datetime.now(tz=zone))
        except CronSimError as exc:
            raise ConfigurationError(f"schedule entry {entry.name!r}: cron expression {expr!r}: {exc}") from None
        entry.cron, entry.tz, entry._zone = expr, tz, zone
        self.entries[entry.name] = entry
        return self

    def every(self, interval: timedelta | float, job: Job, name: str | None = None) -> Schedule:
        """Dispatch ``job`` every ``interval`` (a timedelta or seconds), at whole
        multiples of it since the epoch (UTC), so every scheduler agrees on the ticks."""
        entry = self._entry(job, name)
        seconds = interval.total_seconds() if isinstance(interval, timedelta) else interval
        check_number(f"schedule entry {entry.name!r}: every", seconds, unit="seconds (or a timedelta)")
        entry.every, entry._zone = float(seconds), timezone.utc
        self.entries[entry.name] = entry
        return self

    def _entry(self, job: Job, name: str | None) -> Entry:
        from .jobs import Job

        if not isinstance(job, Job):
            raise ConfigurationError(f"a schedule entry needs a Job instance, got {job!r}")
        entry_name = name if name is not None else type(job).NAME
        if not isinstance(entry_name, str) or not entry_name or any(c in entry_name for c in "\x00\n"):
            raise ConfigurationError(f"a schedule entry's name must be a non-empty string, got {entry_name!r}")
        if entry_name in self.entries:
            raise ConfigurationError(
                f"schedule entry {entry_name!r} is already in the schedule: give the second one name="
            )
        return Entry(entry_name, job)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Any:
        return iter(self.entries.values())


def _zone(entry: str, tz: str) -> Any:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigurationError(f"schedule entry {entry!r}: unknown time zone tz={tz!r}") from None


#: The guard a scheduled job runs behind (see :mod:`rainier_sync.once`).
TickGuard = OnceGuard
