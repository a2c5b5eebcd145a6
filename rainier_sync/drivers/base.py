"""The driver port: what every queue backend implements."""

from __future__ import annotations

import enum
import os
import select
import threading
import weakref
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

from ..types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob

if TYPE_CHECKING:
    from ..manager import QueueManager

__all__ = ["QueueDriver", "BaseQueue", "Waker"]


class QueueDriver(enum.Enum):
    """The six drivers, and what each can promise."""

    SYNC = "sync"
    MEMORY = "memory"
    DATABASE = "database"
    REDIS = "redis"
    SQS = "sqs"
    KAFKA = "kafka"

    def is_deferred(self) -> bool:
        """False only for ``sync``, which runs the job inside ``dispatch``."""
        return self is not QueueDriver.SYNC

    def needs_a_worker(self) -> bool:
        """True when nothing runs unless a ``queue:work`` process is running."""
        return self.is_deferred()

    def survives_a_restart(self) -> bool:
        """True when queued jobs outlive the process that queued them."""
        return self not in (QueueDriver.SYNC, QueueDriver.MEMORY)

    def may_lose_an_accepted_job(self) -> bool:
        """True for ``redis`` only: a dispatch that returned can still vanish
        (snapshot persistence, asynchronous replication, eviction)."""
        return self is QueueDriver.REDIS

    @classmethod
    def parse(cls, value: str) -> QueueDriver:
        try:
            return cls(value.strip().lower())
        except ValueError:
            names = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown queue driver {value!r}; expected one of: {names}") from None


def _close_pipe(read: int, write: int) -> None:
    os.close(read)
    os.close(write)


class Waker:
    """A wake-up flag a worker's owning loop sleeps on.

    Backed by a pipe, so a driver can also ``select()`` on :meth:`fileno`
    together with its own socket (PostgreSQL ``LISTEN``, for instance).
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._flag = False
        # Re-entrant: stop() sets the waker from a signal handler, which may run in
        # the waiting thread while it holds the lock in clear(). Either order of the
        # two leaves the flag raised, never a byte in the pipe with the flag down.
        self._lock = threading.RLock()
        self._closed = False
        # The pipe is closed when the last holder (worker, pool thread, driver) lets go.
        self._finalizer = weakref.finalize(self, _close_pipe, self._read, self._write)

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        if self._flag:  # already awake: the common case under load, no lock needed
            return
        with self._lock:
            if self._flag or self._closed:
                return
            self._flag = True
            try:
                os.write(self._write, b"x")
            except BlockingIOError:  # pragma: no cover - the pipe is full: already awake
                pass

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        """Only the waiting thread clears. It takes the lock set() holds while it
        flags and writes, so the flag and the pipe always agree: a byte left
        behind with the flag down would make every later wait, and every
        select() on fileno(), return at once."""
        if not self._flag:  # a set() in flight raises the flag before it writes, both under the lock
            return
        with self._lock:
            if self._closed:
                return
            self._flag = False
            try:
                os.read(self._read, 512)
            except BlockingIOError:
                pass

    def wait(self, timeout: float | None) -> bool:
        """Block until set or ``timeout`` seconds pass; True when set."""
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        try:
            select.select([self._read], [], [], timeout)
        except (OSError, ValueError):  # closed underneath us
            return True
        return self._flag

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()


class BaseQueue(ABC):
    """The port every deferred driver implements: reserve, then acknowledge.

    A reserved job stays in the store, invisible to other workers, until it is
    acknowledged, released, failed, or its reservation lapses and
    :meth:`reclaim_expired` makes it available again.
    """

    #: Which driver this is.
    driver: QueueDriver
    #: Seconds a reservation lasts before another worker may reclaim the job;
    #: ``None`` when the driver has no reservations (sync).
    reservation: float | None = None
    #: The connection name the manager declared this driver under.
    connection: str = "default"

    def bind(self, manager: QueueManager, connection: str) -> None:
        """Called by the manager that declares this driver."""
        self.connection = connection

    # -- producing ---------------------------------------------------------
    @abstractmethod
    def push(self, job: QueuedJob) -> str:
        """Store one job; returns its id."""

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Store several jobs, in one round trip where the backend allows."""
        return [self.push(job) for job in jobs]

    # -- consuming ---------------------------------------------------------
    @abstractmethod
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """Reserve up to ``limit`` due jobs, trying ``queues`` in order (all of
        the first before any of the second). Never blocks. Each returned job has
        ``attempts`` already counting this attempt."""

    def reserve(self, queues: Sequence[str] | str) -> QueuedJob | None:
        """Reserve one due job, or ``None``."""
        found = self.reserve_many([queues] if isinstance(queues, str) else queues, 1)
        return found[0] if found else None

    @abstractmethod
    def acknowledge(self, job: QueuedJob) -> None:
        """The job is done: remove it."""

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        for job in jobs:
            self.acknowledge(job)

    def acknowledge_and_reserve(self, done: Sequence[QueuedJob], queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """Acknowledge ``done``, then reserve up to ``limit`` jobs as
        :meth:`reserve_many` does: in one round trip, for a driver that can.

        When it raises, nothing was reserved, and the acknowledgements may or may
        not have been applied: the worker sends them again, so acknowledging a
        job twice must be harmless.
        """
        if done:
            self.acknowledge_many(done)
        return self.reserve_many(queues, limit)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Return reserved jobs that never started (a stopping worker's prefetch):
        available again at once, their reservation's attempt not counted where
        the backend allows. The default releases them, which counts it."""
        for job in jobs:
            self.release(job, 0)

    @abstractmethod
    def release(self, job: QueuedJob, delay: float = 0) -> None:
        """Put a reserved job back, available again after ``delay`` seconds."""

    @abstractmethod
    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        """Move a reserved job to the failed store."""

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        """Renew the reservations of running jobs for ``seconds`` (default: the
        driver's reservation) from now."""

    @abstractmethod
    def reclaim_expired(self) -> int:
        """Make every job whose reservation lapsed available again; returns how many."""

    # -- the failed store ----------------------------------------------------
    @abstractmethod
    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        """The most recently failed jobs, newest first."""

    @abstractmethod
    def retry_failed(self, id: str) -> bool:
        """Queue a failed job again (attempts reset); False if no such failed job."""

    @abstractmethod
    def forget_failed(self, id: str) -> bool:
        """Delete a failed job; False if no such failed job."""

    def failed_count(self) -> int:
        return len(self.failed_jobs(limit=1_000_000))

    def failed_job(self, id: str) -> FailedJob | None:
        """One failed job by id, or None. The default reads the whole failed store."""
        for failed in self.failed_jobs(limit=max(self.failed_count(), 1)):
            if failed.id == id:
                return failed
        return None

    # -- inspection --------------------------------------------------------
    @abstractmethod
    def size(self, queue: str | None = None) -> int:
        """Jobs not yet done on ``queue`` (ready, delayed and reserved)."""

    def counts(self, queue: str) -> QueueCounts:
        """Ready, delayed and reserved counts of one queue, where the backend can tell."""
        return QueueCounts(ready=self.size(queue))

    def queue_names(self) -> list[str]:
        """Queues this backend knows to hold jobs (best effort)."""
        return []

    # -- waiting -----------------------------------------------------------
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Block up to ``timeout`` seconds, returning early when a job may have
        become available or ``waker`` is set. The default only honours the waker."""
        waker.wait(timeout)

    def worker_stopped(self) -> None:
        """A worker that waited on this driver has stopped: let go of what its idle
        waits hold (the Redis driver's blocking read). The driver stays usable."""

    def announce_discarded(self, info: ExceptionInfo, raw: object) -> None:
        """Tell listeners (``queue_message_discarded``) about a message this
        driver could not read and moved to its failed store."""
        from .. import signals

        signals.emit(
            signals.queue_message_discarded, self, connection=self.connection, error=info.error, exception=info, raw=raw
        )

    def close(self) -> None:
        """Release connections and threads."""

    def describe(self) -> str:
        return self.driver.value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def as_job_list(jobs: QueuedJob | Sequence[QueuedJob]) -> list[QueuedJob]:
    """``extend`` takes one job or several."""
    return [jobs] if isinstance(jobs, QueuedJob) else list(jobs)
