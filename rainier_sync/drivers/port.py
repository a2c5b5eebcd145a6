"""The core port: what every queue backend implements.

Its parts: a :class:`Producer` (storing jobs), the :class:`Consumer`
operations that a worker's owning loop opens as a :class:`ConsumerSession`
(claim, settle, renew, reclaim, wait), a :class:`FailedStore`, an
:class:`Inspector`, and the :class:`Capabilities` a driver declares. What a
driver may do beyond them is an extension it opts into
(:mod:`rainier_sync.drivers.extensions`);
:class:`~rainier_sync.drivers.base.BaseQueue` puts the parts together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import CapabilityError
from ..types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob
from .capabilities import Capabilities
from .extensions import forwarded
from .waker import Waker

__all__ = ["Capabilities", "Producer", "Consumer", "ConsumerSession", "FailedStore", "Inspector"]


def _refuse(driver: Any, capability: str, what: str) -> CapabilityError:
    return CapabilityError(f"{type(driver).__name__} ({driver.describe()}) cannot {what} (capability {capability!r})")


class Producer(ABC):
    """The producer side of the port: storing jobs."""

    #: The most jobs of one queue a ``push_many`` stores all or none of, for a driver
    #: whose failed ``push_many`` cannot say which went through (:mod:`.pushed`);
    #: None: any number, or its errors say. The outbox's relay pushes no more at a time.
    atomic_batch: int | None = None

    @abstractmethod
    def push(self, job: QueuedJob) -> str:
        """Store one job; returns its id."""

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Store several jobs, in one round trip where the backend allows. One that
        raises after storing some of them says which on the exception
        (:func:`~rainier_sync.drivers.pushed.tell_pushed`)."""
        return [self.push(job) for job in jobs]

    def check(self, job: QueuedJob) -> None:
        """Raise what ``push`` would raise for ``job`` for good, storing nothing:
        :class:`~rainier_sync.errors.PayloadError` for a job this backend can never
        take, :class:`~rainier_sync.errors.UnknownQueueError` for a queue it has no
        place for. ``push`` runs the same checks; the outbox runs them at dispatch,
        before the caller's transaction commits. The default accepts."""


class Consumer(ABC):
    """The consumer operations: claim, settle, renew, reclaim and wait.

    A worker's owning loop uses them through the :class:`ConsumerSession` it
    opens with :meth:`BaseQueue.open_session`; scripts and tests may call them
    on the driver itself.
    """

    #: What the driver behind these operations can do (a driver may refine it per instance).
    capabilities: Capabilities = Capabilities()

    @abstractmethod
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """Reserve up to ``limit`` due jobs, trying ``queues`` in order (all of the
        first before any of the second). Never blocks. Each returned job has
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
        :meth:`reserve_many` does: in one round trip where the driver declares
        ``Capabilities.combined_claim``.

        When it raises, nothing was reserved, and the acknowledgements may or may
        not have been applied: the worker sends them again, so acknowledging a
        job twice must be harmless.
        """
        if done:
            self.acknowledge_many(done)
        return self.reserve_many(queues, limit)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Return reserved jobs that never ran (a stopping worker's prefetch, an
        attempt its stop cut short): available again at once, their attempt not
        spent (``Capabilities.give_back``)."""
        raise _refuse(self, "give_back", "hand a job back without spending its attempt")

    def defer(self, job: QueuedJob, delay: float) -> None:
        """Put a reserved job back, due in ``delay`` seconds, its attempt not spent
        (a middleware deferred it)."""
        raise _refuse(self, "give_back", "put a job back without spending its attempt")

    @abstractmethod
    def release(self, job: QueuedJob, delay: float = 0) -> None:
        """Put a reserved job back, available again after ``delay`` seconds."""

    @abstractmethod
    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        """Move a reserved job to the failed store."""

    @abstractmethod
    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        """Renew the reservations of running jobs for ``seconds`` (default: the
        driver's reservation) from now (``Capabilities.renews``)."""

    @abstractmethod
    def reclaim_expired(self) -> int:
        """Make every job whose reservation lapsed available again; returns how many."""

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Block up to ``timeout`` seconds, returning early when a job may have
        become available or ``waker`` is set. The default only honours the waker
        (``Capabilities.wakes`` says a driver does better)."""
        waker.wait(timeout)


class ConsumerSession(Consumer):
    """The consumer operations as one owning loop (a worker's) holds them open:
    opened by :meth:`BaseQueue.open_session`, closed when the loop ends. Not shared
    between threads.

    The methods of each extension its driver declares come from the driver
    (:func:`~rainier_sync.drivers.extensions.forwarded`) unless the session
    defines its own; those of an extension it does not declare refuse by name.
    """

    #: The driver this session works for.
    driver: Any

    if not TYPE_CHECKING:

        def __getattr__(self, name):
            if name == "driver" or name.startswith("__"):
                raise AttributeError(name)
            return forwarded(self, self.driver, name)

    @abstractmethod
    def close(self) -> None:
        """The loop has ended: let go of what its waits and claims hold. The
        driver stays usable."""


class FailedStore(ABC):
    """The failed store: jobs that used up their attempts, or could not be read."""

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


class Inspector(ABC):
    """Read-only inspection: how many jobs, where."""

    @abstractmethod
    def size(self, queue: str | None = None) -> int:
        """Jobs not yet done on ``queue`` (ready, delayed and reserved)."""

    def counts(self, queue: str) -> QueueCounts:
        """Ready, delayed and reserved counts of one queue, where the backend can tell."""
        return QueueCounts(ready=self.size(queue))

    def queue_names(self) -> list[str]:
        """Queues this backend knows to hold jobs (best effort)."""
        return []
