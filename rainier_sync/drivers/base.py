"""A driver: the core port (:mod:`.port`) in one class, :class:`BaseQueue`,
and :class:`SharedSession`, the consumer session of most drivers.

The names of :mod:`.port`, :mod:`.extensions` and :mod:`.promises` are
importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from ..errors import CapabilityError
from ..types import ExceptionInfo, FailedJob, QueuedJob
from .extensions import (
    CountsBatches,
    CountsRetries,
    DispatchesWithin,
    Extension,
    HandsOver,
    LendsLocks,
    ListsJobs,
    StreamsPush,
    declared_extensions,
    missing,
)
from .port import Capabilities, Consumer, ConsumerSession, FailedStore, Inspector, Producer, _refuse
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
    "Extension",
    "DispatchesWithin",
    "StreamsPush",
    "HandsOver",
    "CountsBatches",
    "CountsRetries",
    "ListsJobs",
    "LendsLocks",
]


class Binding(Protocol):
    """What a driver is told of the manager that declares it."""

    registry: JobRegistry
    container: Container
    locks: LockStore | None


class SharedSession(ConsumerSession):
    """The session of a driver whose consumer state is all its own (most of
    them): each core operation goes straight to the driver, and so does each
    method of an extension the driver declares (:class:`ConsumerSession`)."""

    driver: BaseQueue

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

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        self.driver.extend(jobs, seconds)

    def reclaim_expired(self) -> int:
        return self.driver.reclaim_expired()

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        self.driver.wait_for_jobs(queues, timeout, waker)

    def close(self) -> None:
        """Nothing of its own to release: the driver keeps its consumer state."""


class BaseQueue(Producer, Consumer, FailedStore, Inspector):
    """The port every driver implements: a :class:`Producer`, the
    :class:`Consumer` operations (opened per owning loop as a
    :class:`ConsumerSession`), a :class:`FailedStore` and an :class:`Inspector`,
    with the :class:`Capabilities` it declares. A driver opts into an extension
    of :mod:`~rainier_sync.drivers.extensions` by inheriting it and declaring its
    flag; a method of one it does not declare refuses by name.

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for kind in declared_extensions(cls.capabilities):
            if not issubclass(cls, kind):
                raise TypeError(f"{cls.__name__} declares {kind.flag!r} but is no {kind.__name__}")

    if not TYPE_CHECKING:

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return missing(self, name)

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
