"""What a driver may do beyond the core port (:mod:`.port`): small extensions it opts into.

A driver opts into one by inheriting its class and declaring its flag in
:class:`~rainier_sync.drivers.port.Capabilities`. The code that needs one asks
the declaration, never the driver's methods: ``ListsJobs.of(driver)`` gives
the driver (or one of its consumer sessions) as that extension, or raises
:class:`~rainier_sync.errors.CapabilityError` naming the capability it lacks.
Calling an extension's method on a driver that does not declare it raises the
same error, and a consumer session forwards the methods of each extension its
driver declares (:func:`forwarded`), so none is forgotten.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping, NoReturn, Sequence, TypeVar

from ..errors import CapabilityError
from ..types import ExceptionInfo, FailedJob, JobState, ListedJob, QueuedJob
from .paging import Page

if TYPE_CHECKING:
    from ..state.base import LockStore
    from .capabilities import Capabilities

__all__ = [
    "Extension",
    "DispatchesWithin",
    "StreamsPush",
    "HandsOver",
    "CountsBatches",
    "CountsRetries",
    "ListsJobs",
    "LendsLocks",
    "EXTENSIONS",
    "declared_extensions",
    "refusal",
    "missing",
    "forwarded",
]

E = TypeVar("E", bound="Extension")


class Extension(ABC):
    """One optional part of the port, declared by a :class:`Capabilities` flag."""

    #: The :class:`Capabilities` field that declares it.
    flag: ClassVar[str]
    #: What each of its methods does, for the refusal of a driver without it.
    refusals: ClassVar[Mapping[str, str]]

    @staticmethod
    @abstractmethod
    def declared(capabilities: Capabilities) -> bool:
        """Whether ``capabilities`` declare this extension."""

    @classmethod
    def of(cls: type[E], driver: Any) -> E:
        """``driver`` (or one of its consumer sessions) as this extension, which its
        capabilities declare; :class:`~rainier_sync.errors.CapabilityError` naming it otherwise."""
        if not cls.declared(driver.capabilities):
            raise refusal(driver, cls)
        return driver  # type: ignore[no-any-return]

    @classmethod
    def refuse(cls, driver: Any, method: str) -> NoReturn:
        """Refuse ``method`` by name: for a driver that implements this extension but,
        as this instance is set up, does not declare it."""
        raise refusal(driver, cls, method)


class DispatchesWithin(Extension):
    """Writes jobs, and the unique locks it keeps, in the caller's own database transaction
    (``Capabilities.transactional_dispatch``)."""

    flag = "transactional_dispatch"
    refusals = {
        "push_within": "dispatch within a caller's transaction",
        "lock_within": "take unique locks within a caller's transaction",
        "unlock_within": "give back unique locks within a caller's transaction",
    }

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.transactional_dispatch

    @abstractmethod
    def push_within(self, connection: Any, jobs: Sequence[QueuedJob]) -> list[str]:
        """Write ``jobs`` on the caller's open connection, in its transaction."""

    @abstractmethod
    def lock_within(self, connection: Any, wanted: Sequence[tuple[str, str, float]]) -> list[bool] | None:
        """Take unique locks ``(key, owner, ttl)`` in the caller's transaction on
        ``connection`` (before ``push_within``), where the manager's lock store
        keeps them in this same database: a rollback takes them back with the
        jobs. Which were taken; None when the lock store is elsewhere, and the
        manager takes them in the lock store itself."""

    @abstractmethod
    def unlock_within(self, connection: Any, held: Sequence[tuple[str, str]]) -> None:
        """Give back, in the caller's transaction, ``(key, owner)`` locks
        :meth:`lock_within` took, after a ``push_within`` that failed."""


class StreamsPush(Extension):
    """Stores a batch while it is being built (``Capabilities.streaming_push``)."""

    flag = "streaming_push"
    refusals = {"push_stream": "store a batch while it is being built"}

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.streaming_push

    @abstractmethod
    def push_stream(self, slices: Iterator[Sequence[QueuedJob]]) -> None:
        """Store the jobs of ``slices`` while later slices are still being built."""


class HandsOver(Extension):
    """Stores jobs in the transaction that settles another: a chain's next link,
    its catch job (``Capabilities.hands_over``)."""

    flag = "hands_over"
    refusals = {
        "acknowledge_handing_over": "store jobs in the transaction that acknowledges one",
        "fail_handing_over": "store jobs in the transaction that fails one",
    }

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.hands_over

    @abstractmethod
    def acknowledge_handing_over(self, job: QueuedJob, follow: Sequence[QueuedJob]) -> None:
        """Acknowledge ``job`` and store ``follow`` in the same transaction, only
        if ``job`` was still held by this reservation: both happen or neither.
        Sent again after a failure, it stores nothing twice."""

    @abstractmethod
    def fail_handing_over(
        self, job: QueuedJob, error: BaseException | str | ExceptionInfo, follow: Sequence[QueuedJob]
    ) -> FailedJob:
        """Fail ``job`` and store ``follow`` in the same transaction, only if ``job`` was still held."""


class CountsBatches(Extension):
    """Counts the jobs of batches in the transactions that settle them, for a lock
    store that keeps its tallies in this driver's backend (``Capabilities.counts_batches``)."""

    flag = "counts_batches"
    refusals = {
        "counts_batches_of": "count the jobs of batches with their acknowledgements",
        "acknowledge_counting": "count the jobs of batches with their acknowledgements",
        "settle_counting": "count the jobs of batches with their acknowledgements",
    }

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.counts_batches

    @abstractmethod
    def counts_batches_of(self, store: Any) -> bool:
        """Whether ``store`` (a lock store) keeps its batches' tallies in this
        driver's own backend, so that :meth:`acknowledge_counting` and
        :meth:`settle_counting` count for it."""

    @abstractmethod
    def acknowledge_counting(
        self,
        done: Sequence[QueuedJob],
        counts: Sequence[tuple[QueuedJob, str, str, float]],
        queues: Sequence[str],
        limit: int,
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """``acknowledge_and_reserve`` of ``done``, counting the jobs of
        ``counts`` (``(job, tally key, field, ttl)``, each also in ``done``) in
        their tallies with their acknowledgement. Returns the jobs claimed and
        the jobs of ``counts`` left unacknowledged and uncounted, for
        :meth:`settle_counting` (those whose batch the round could finish)."""

    @abstractmethod
    def settle_counting(self, settled: Sequence[tuple[Any, ExceptionInfo | None]], after: Any) -> None:
        """In one transaction: acknowledge each ``(count item, None)`` job, or fail
        each ``(count item, error)`` one, count those this reservation still held,
        and call ``after(counts by tally key, keys that counted a failure, cancel)``
        before the commit (see :mod:`rainier_sync.drivers.database.counting`)."""


class CountsRetries(CountsBatches):
    """Also takes a retried failed job's failure out of its batch's tally in the
    transaction that queues it again (``Capabilities.counts_retries``)."""

    flag = "counts_retries"
    refusals = {"retry_failed_counting": "retry a failed job of a batch in the transaction that counts it"}

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.counts_retries

    @abstractmethod
    def retry_failed_counting(self, id: str, tally: str, ttl: float) -> bool:
        """``retry_failed(id)``, its failure taken out of ``tally`` (failed -1,
        pending +1, kept ``ttl`` seconds) in the same transaction."""


class ListsJobs(Extension):
    """Reads the jobs stored, not only their counts (``Capabilities.listing``)."""

    flag = "listing"
    refusals = {"list_jobs": "list the jobs it stores", "find_job": "look a stored job up by id"}

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.listing

    @abstractmethod
    def list_jobs(
        self, queue: str, state: JobState, *, name: str | None = None, offset: int = 0, limit: int = 50
    ) -> Page:
        """The jobs of ``queue`` in ``state`` (``ready`` in the order they would be
        claimed, ``delayed`` by due time, ``reserved`` by when their reservation
        lapses), skipping ``offset`` and at most ``limit``; ``name`` keeps only
        jobs whose ``NAME`` contains it, and the :class:`~rainier_sync.drivers.paging.Page`
        says how far a bounded filter looked."""

    @abstractmethod
    def find_job(self, id: str) -> ListedJob | None:
        """One stored job (ready, delayed or reserved) by id, or None."""


class LendsLocks(Extension):
    """Lends a lock store in its own backend, which a manager whose default
    connection it is uses when given no ``locks=`` (``Capabilities.lends_locks``)."""

    flag = "lends_locks"
    refusals = {"lock_store": "lend a lock store of its own"}

    @staticmethod
    def declared(capabilities: Capabilities) -> bool:
        return capabilities.lends_locks

    @abstractmethod
    def lock_store(self) -> LockStore | None:
        """The store in this driver's backend (None: it has none, as built)."""


#: Every extension, and the extension each of their methods belongs to.
EXTENSIONS: tuple[type[Extension], ...] = (
    DispatchesWithin,
    StreamsPush,
    HandsOver,
    CountsBatches,
    CountsRetries,
    ListsJobs,
    LendsLocks,
)
_BY_METHOD: dict[str, type[Extension]] = {name: kind for kind in EXTENSIONS for name in kind.refusals}


def refusal(driver: Any, kind: type[Extension], method: str | None = None) -> CapabilityError:
    """The error for ``driver`` asked for ``kind``, which it does not declare."""
    what = kind.refusals[method] if method is not None else next(iter(kind.refusals.values()))
    return CapabilityError(f"{type(driver).__name__} ({driver.describe()}) cannot {what} (capability {kind.flag!r})")


def declared_extensions(capabilities: Capabilities) -> list[type[Extension]]:
    """The extensions ``capabilities`` declare."""
    return [kind for kind in EXTENSIONS if kind.declared(capabilities)]


def _refusing(driver: Any, kind: type[Extension], method: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise refusal(driver, kind, method)

    return refuse


def missing(driver: Any, name: str) -> Callable[..., NoReturn]:
    """A driver's answer for ``name``, not found on it: an extension method refuses by name."""
    kind = _BY_METHOD.get(name)
    if kind is None:
        raise AttributeError(f"{type(driver).__name__!r} object has no attribute {name!r}")
    if kind.declared(driver.capabilities):
        raise AttributeError(
            f"{type(driver).__name__} declares {kind.flag!r} but does not implement {name} ({kind.__name__})"
        )
    return _refusing(driver, kind, name)


def forwarded(session: Any, driver: Any, name: str) -> Any:
    """A consumer session's answer for ``name``, not found on it: the driver's own
    method of an extension the session's capabilities declare, else its refusal."""
    kind = _BY_METHOD.get(name)
    if kind is None:
        raise AttributeError(f"{type(session).__name__!r} object has no attribute {name!r}")
    if not kind.declared(session.capabilities):
        return _refusing(session, kind, name)
    method = getattr(driver, name)
    session.__dict__[name] = method  # found once: later calls go straight to the driver
    return method
