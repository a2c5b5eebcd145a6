"""The driver port: what every queue backend implements.

Its parts: a :class:`Producer` (storing jobs), the :class:`Consumer`
operations that a worker's owning loop opens as a :class:`ConsumerSession`
(claim, settle, renew, reclaim, wait), a :class:`FailedStore`, an
:class:`Inspector`, and the :class:`Capabilities` a driver declares.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from ..errors import (
    CapabilityError,
)
from ..types import ExceptionInfo, FailedJob, JobState, ListedJob, QueueCounts, QueuedJob
from .paging import Page
from .promises import Promises, QueueDriver
from .waker import Waker

if TYPE_CHECKING:
    from ..container import Container
    from ..registry import JobRegistry
    from ..state.base import LockStore

__all__ = [
    "QueueDriver",
    "Promises",
    "Binding",
    "Capabilities",
    "CapabilityError",
    "Producer",
    "Consumer",
    "ConsumerSession",
    "SharedSession",
    "FailedStore",
    "Inspector",
    "BaseQueue",
    "Waker",
]


class Binding(Protocol):
    """What a driver is told of the manager that declares it."""

    registry: JobRegistry
    container: Container
    locks: LockStore | None


@dataclass(frozen=True)
class Capabilities:
    """What a driver can do beyond the port's common ground, declared by the
    driver and read by the worker, the manager, the command line and the
    dashboard (nothing probes a driver for methods).

    A driver that declares a capability implements the method it names; one that
    does not is never asked for it, and its default refuses by name.
    """

    #: A lower ``PRIORITY`` runs first within a queue.
    priority: bool = True
    #: Jobs claimed and never started go back without spending an attempt (:meth:`Consumer.give_back`),
    #: so the worker may claim ahead of its threads.
    give_back: bool = False
    #: :meth:`Consumer.extend` renews reservations: the worker's heartbeat keeps long jobs claimed.
    renews: bool = True
    #: :meth:`Consumer.wait_for_jobs` returns when a job is pushed (not only when its timeout passes).
    wakes: bool = False
    #: :meth:`Consumer.acknowledge_and_reserve` settles and claims in one round trip.
    combined_claim: bool = False
    #: :meth:`Producer.push_stream` stores a batch while it is being built.
    streaming_push: bool = False
    #: :meth:`Producer.push_within` writes jobs in the caller's own database transaction.
    transactional_dispatch: bool = False
    #: :meth:`BaseQueue.check_eviction_policy` can tell whether the backend may evict jobs.
    eviction_check: bool = False
    #: :meth:`BaseQueue.migrate` creates or updates the backend's tables.
    migrations: bool = False
    #: :meth:`Inspector.list_jobs` and :meth:`Inspector.find_job` read the jobs stored, not only their counts.
    listing: bool = False
    #: :meth:`Consumer.acknowledge_handing_over` and :meth:`Consumer.fail_handing_over` store jobs
    #: in the transaction that settles another (a chain's next link, its catch job).
    hands_over: bool = False


def _refuse(driver: Any, capability: str, what: str) -> CapabilityError:
    return CapabilityError(f"{type(driver).__name__} ({driver.describe()}) cannot {what} (capability {capability!r})")


def _cannot_count(driver: Any) -> CapabilityError:
    return CapabilityError(
        f"{type(driver).__name__} cannot count the jobs of batches with their acknowledgements "
        "(counts_batches_of says so first)"
    )


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

    def push_stream(self, slices: Iterator[Sequence[QueuedJob]]) -> None:
        """Store the jobs of ``slices`` while later slices are still being built
        (``Capabilities.streaming_push``)."""
        raise _refuse(self, "streaming_push", "store a batch while it is being built")

    def push_within(self, connection: Any, jobs: Sequence[QueuedJob]) -> list[str]:
        """Write ``jobs`` on the caller's open connection, in its transaction
        (``Capabilities.transactional_dispatch``)."""
        raise _refuse(self, "transactional_dispatch", "dispatch within a caller's transaction")

    def lock_within(self, connection: Any, wanted: Sequence[tuple[str, str, float]]) -> list[bool] | None:
        """Take unique locks ``(key, owner, ttl)`` in the caller's transaction on
        ``connection`` (before ``push_within``), where the manager's lock store
        keeps them in this same database: a rollback takes them back with the
        jobs. Which were taken; None when this driver cannot (the lock store is
        elsewhere), and the manager takes them in the lock store itself."""
        return None

    def unlock_within(self, connection: Any, held: Sequence[tuple[str, str]]) -> None:
        """Give back, in the caller's transaction, ``(key, owner)`` locks
        :meth:`lock_within` took, after a ``push_within`` that failed."""


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

    def acknowledge_handing_over(self, job: QueuedJob, follow: Sequence[QueuedJob]) -> None:
        """Acknowledge ``job`` and store ``follow`` in the same transaction, only
        if ``job`` was still held by this reservation: both happen or neither
        (``Capabilities.hands_over``). Sent again after a failure, it stores nothing twice."""
        raise _refuse(self, "hands_over", "store jobs in the transaction that acknowledges one")

    def fail_handing_over(
        self, job: QueuedJob, error: BaseException | str | ExceptionInfo, follow: Sequence[QueuedJob]
    ) -> FailedJob:
        """:meth:`fail` ``job`` and store ``follow`` in the same transaction, only if
        ``job`` was still held (``Capabilities.hands_over``)."""
        raise _refuse(self, "hands_over", "store jobs in the transaction that fails one")

    def counts_batches_of(self, store: Any) -> bool:
        """Whether ``store`` (a lock store) keeps its batches' tallies in this
        driver's own backend, so that :meth:`acknowledge_counting` and
        :meth:`settle_counting` count the jobs of batches in the transactions
        that settle them. The default: no (the worker counts them in the store)."""
        return False

    def acknowledge_counting(
        self,
        done: Sequence[QueuedJob],
        counts: Sequence[tuple[QueuedJob, str, str, float]],
        queues: Sequence[str],
        limit: int,
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """:meth:`acknowledge_and_reserve` of ``done``, counting the jobs of
        ``counts`` (``(job, tally key, field, ttl)``, each also in ``done``) in
        their tallies with their acknowledgement. Returns the jobs claimed and
        the jobs of ``counts`` left unacknowledged and uncounted, for
        :meth:`settle_counting` (those whose batch the round could finish)."""
        raise _cannot_count(self)

    def settle_counting(self, settled: Sequence[tuple[Any, ExceptionInfo | None]], after: Any) -> None:
        """In one transaction: acknowledge each ``(count item, None)`` job, or fail
        each ``(count item, error)`` one, count those this reservation still held,
        and call ``after(counts by tally key, keys that counted a failure, cancel)``
        before the commit (see :mod:`rainier_sync.drivers.database.counting`)."""
        raise _cannot_count(self)

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
    between threads."""

    @abstractmethod
    def close(self) -> None:
        """The loop has ended: let go of what its waits and claims hold. The
        driver stays usable."""


class SharedSession(ConsumerSession):
    """The session of a driver whose consumer state is all its own (most of
    them): each operation goes straight to the driver."""

    def __init__(self, driver: BaseQueue) -> None:
        self.driver = driver
        self.capabilities = driver.capabilities

    def describe(self) -> str:
        return self.driver.describe()

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self.driver.reserve_many(queues, limit)

    def acknowledge(self, job: QueuedJob) -> None:
        self.driver.acknowledge(job)

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        self.driver.acknowledge_many(jobs)

    def acknowledge_and_reserve(self, done: Sequence[QueuedJob], queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self.driver.acknowledge_and_reserve(done, queues, limit)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        self.driver.give_back(jobs)

    def defer(self, job: QueuedJob, delay: float) -> None:
        self.driver.defer(job, delay)

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self.driver.release(job, delay)

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        return self.driver.fail(job, error)

    def acknowledge_handing_over(self, job: QueuedJob, follow: Sequence[QueuedJob]) -> None:
        self.driver.acknowledge_handing_over(job, follow)

    def counts_batches_of(self, store: Any) -> bool:
        return self.driver.counts_batches_of(store)

    def acknowledge_counting(
        self,
        done: Sequence[QueuedJob],
        counts: Sequence[tuple[QueuedJob, str, str, float]],
        queues: Sequence[str],
        limit: int,
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        return self.driver.acknowledge_counting(done, counts, queues, limit)

    def settle_counting(self, settled: Sequence[tuple[Any, ExceptionInfo | None]], after: Any) -> None:
        self.driver.settle_counting(settled, after)

    def fail_handing_over(
        self, job: QueuedJob, error: BaseException | str | ExceptionInfo, follow: Sequence[QueuedJob]
    ) -> FailedJob:
        return self.driver.fail_handing_over(job, error, follow)

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        self.driver.extend(jobs, seconds)

    def reclaim_expired(self) -> int:
        return self.driver.reclaim_expired()

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        self.driver.wait_for_jobs(queues, timeout, waker)

    def close(self) -> None:
        """Nothing of its own to release: the driver keeps its consumer state."""


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

    def list_jobs(
        self, queue: str, state: JobState, *, name: str | None = None, offset: int = 0, limit: int = 50
    ) -> Page:
        """The jobs of ``queue`` in ``state`` (``ready`` in the order they would be
        claimed, ``delayed`` by due time, ``reserved`` by when their reservation
        lapses), skipping ``offset`` and at most ``limit``; ``name`` keeps only
        jobs whose ``NAME`` contains it, and the :class:`~rainier_sync.drivers.paging.Page`
        says how far a bounded filter looked (``Capabilities.listing``)."""
        raise _refuse(self, "listing", "list the jobs it stores")

    def find_job(self, id: str) -> ListedJob | None:
        """One stored job (ready, delayed or reserved) by id, or None (``Capabilities.listing``)."""
        raise _refuse(self, "listing", "look a stored job up by id")


class BaseQueue(Producer, Consumer, FailedStore, Inspector):
    """The port every driver implements: a :class:`Producer`, the
    :class:`Consumer` operations (opened per owning loop as a
    :class:`ConsumerSession`), a :class:`FailedStore` and an :class:`Inspector`,
    with the :class:`Capabilities` it declares.

    Reserve, then acknowledge: a reserved job stays in the store, invisible to
    other workers, until it is acknowledged, released, failed, or its
    reservation lapses and :meth:`reclaim_expired` makes it available again.
    """

    #: Which of the six drivers this is (``None`` for a driver from elsewhere, which
    #: names itself with :attr:`kind` and declares its :attr:`promises`).
    driver: QueueDriver | None = None
    #: What it promises about the jobs it accepts.
    promises: Promises = Promises()
    #: Seconds a reservation lasts before another worker may reclaim the job;
    #: ``None`` when the driver has no reservations (sync).
    reservation: float | None = None
    #: The connection name the manager declared this driver under.
    connection: str = "default"

    def bind(self, manager: Binding, connection: str) -> None:
        """Called by the manager that declares this driver."""
        self.connection = connection

    def open_session(self) -> ConsumerSession:
        """Open the consumer session one owning loop (a worker's) works through."""
        return SharedSession(self)

    # -- optional, by capability ---------------------------------------------------------
    def migrate(self) -> list[int]:
        """Create or update the backend's tables; the versions applied (``Capabilities.migrations``)."""
        raise _refuse(self, "migrations", "migrate")

    def check_eviction_policy(self) -> str | None:
        """Warn (and return the policy) when the backend may evict jobs (``Capabilities.eviction_check``)."""
        raise _refuse(self, "eviction_check", "check an eviction policy")

    # -- messages the driver could not read ----------------------------------------------
    def announce_discarded(self, info: ExceptionInfo, raw: object) -> None:
        """Tell listeners (``queue_message_discarded``) about a message this
        driver could not read and moved to its failed store."""
        from .. import signals

        signals.emit(
            signals.queue_message_discarded, self, connection=self.connection, error=info.error, exception=info, raw=raw
        )

    def close(self) -> None:
        """Release connections and threads."""

    @property
    def kind(self) -> str:
        """The driver's name, as configuration spells it (``"redis"``); a driver
        from elsewhere overrides it."""
        if self.driver is None:
            return type(self).__name__
        return self.driver.value

    def describe(self) -> str:
        """The driver's name and where it points, for messages."""
        return self.kind

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def as_job_list(jobs: QueuedJob | Sequence[QueuedJob]) -> list[QueuedJob]:
    """``extend`` takes one job or several."""
    return [jobs] if isinstance(jobs, QueuedJob) else list(jobs)
