"""How a worker runs (:class:`WorkerOptions`) and what a run did (:class:`WorkerStats`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from .._checks import check_number
from ..errors import ConfigurationError
from .child import load_child_setup

__all__ = ["WorkerOptions", "WorkerStats", "ONCE_GIVE_UP", "PREFETCH_WINDOW", "ACK_DELAY"]

#: Seconds of failing backend operations after which a ``once`` worker gives up (the default).
ONCE_GIVE_UP = 30.0
#: Seconds of work, at the jobs' measured pace, a worker claims ahead of its threads.
PREFETCH_WINDOW = 0.05
#: Seconds a finished job may wait to be acknowledged with the next batch while the worker is busy.
ACK_DELAY = 0.005


def _option(name: str, value: Any, **rules: Any) -> None:
    check_number(f"worker option {name}", value, **rules)


@dataclass
class WorkerOptions:
    """How a worker runs.

    - ``queues``: tried in this order (all of the first before any of the next).
    - ``concurrency``: threads running handlers.
    - ``sleep``: longest idle wait, in seconds (the backend usually wakes it
      sooner). With a lock store the loop still turns about every 5 s, to
      refresh the worker's record (see :mod:`rainier_sync.fleet`).
    - ``max_jobs``: stop after taking this many jobs (a worker that recycles).
    - ``timeout``: seconds an attempt may run when its job sets no ``TIMEOUT``;
      a timed attempt runs in a supervised child process. None: no limit.
    - ``once``: run what is due, then return (the cron mode).
    - ``give_up``: with ``once``, seconds the backend may keep failing (every
      failed operation counts, from the first of a run of failures to the next
      success; at start-up too, while it cannot be reached yet) before the run ends with
      :class:`~rainier_sync.errors.QueueUnavailableError`: long enough to ride
      out a blip, short enough that a cron run never overlaps the next one.
    - ``grace``: seconds running jobs get to finish after :meth:`Worker.stop`.
    - ``heartbeat``: seconds between reservation renewals (default: a third
      of the driver's reservation).
    - ``reclaim_interval``: seconds between sweeps for lapsed reservations.
    - ``max_jobs_per_child``: attempts a timeout child runs before it is replaced.
    - ``prefetch``: the most jobs claimed ahead of the threads, so that short
      jobs are claimed and acknowledged many to a round trip. The worker uses
      only as much of it as its threads would start within
      :data:`PREFETCH_WINDOW` at the jobs' measured pace, so long jobs are still
      claimed one per free thread and left for other workers. 0 claims only for
      free threads. ``None``: 8 per thread.
    - ``schedule``: also dispatch the manager's periodic jobs as they fall due
      (each tick once across every scheduling worker that shares the lock store).
    - ``child_setup``: ``"package.module:function"`` called in each new timeout
      child before its first attempt, to reopen what must not be shared across
      a fork; it may return a :class:`~rainier_sync.Container` for the child to
      use instead of the inherited one.
    - ``health_file``: a path the owning loop touches about once a second
      while it turns, for a liveness probe (``rainier-sync queue:health``);
      with it the loop turns at least that often, busy or idle. Its
      directory must exist.
    - ``relay``: also run the manager's outbox relay (:mod:`rainier_sync.outbox`)
      in a thread beside the loop, polling every ``sleep`` where it cannot
      listen; with ``once``, relay what is committed before the first claim.
    """

    queues: Sequence[str] = ("default",)
    concurrency: int = 8
    sleep: float = 1.0
    max_jobs: int | None = None
    timeout: float | None = None
    once: bool = False
    give_up: float = ONCE_GIVE_UP
    connection: str | None = None
    grace: float = 30.0
    heartbeat: float | None = None
    reclaim_interval: float = 60.0
    max_jobs_per_child: int | None = 1000
    child_setup: str | None = None
    prefetch: int | None = None
    schedule: bool = False
    health_file: str | None = None
    relay: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.queues, str):
            self.queues = [q for q in self.queues.split(",") if q]
        self.queues = list(self.queues)
        if not self.queues or not all(isinstance(q, str) and q and "\x00" not in q for q in self.queues):
            raise ConfigurationError(f"worker option queues must be non-empty queue names, got {self.queues!r}")
        _option("concurrency", self.concurrency, whole=True)
        _option("max_jobs", self.max_jobs, whole=True, none=True)
        _option("sleep", self.sleep, zero=True)
        _option("timeout", self.timeout, none=True)
        _option("grace", self.grace, zero=True)
        _option("give_up", self.give_up, zero=True)
        _option("heartbeat", self.heartbeat, none=True)
        _option("reclaim_interval", self.reclaim_interval)
        _option("max_jobs_per_child", self.max_jobs_per_child, whole=True, none=True)
        _option("prefetch", self.prefetch, whole=True, zero=True, none=True)
        load_child_setup(self.child_setup)
        self.health_file = _health_file(self.health_file)
        if not isinstance(self.relay, bool):
            raise ConfigurationError(f"worker option relay must be True or False, got {self.relay!r}")

    @property
    def most_ahead(self) -> int:
        """The prefetch limit in jobs (``prefetch``, or its default)."""
        return 8 * self.concurrency if self.prefetch is None else self.prefetch


def _health_file(path: Any) -> str | None:
    if path is None:
        return None
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ConfigurationError(f"worker option health_file must be a file path, got {path!r}")
    if os.path.isdir(path):
        raise ConfigurationError(f"worker option health_file {path!r} is a directory; name a file in it")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigurationError(f"worker option health_file {path!r}: directory {directory!r} does not exist")
    return path


@dataclass
class WorkerStats:
    """What a worker run did: jobs ``processed`` (succeeded), ``released`` for
    another attempt, ``failed`` for good, ``idles`` (waits on an empty queue),
    ``discarded`` (stored jobs that could not be read, moved to the failed
    store), ``deferred`` and ``skipped`` (by a job's middleware), and
    ``interrupted`` (attempts cut short by :meth:`Worker.stop`, handed back
    without spending a try)."""

    processed: int = 0
    released: int = 0
    failed: int = 0
    idles: int = 0
    discarded: int = 0
    deferred: int = 0
    skipped: int = 0
    interrupted: int = 0
