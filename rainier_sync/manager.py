"""The queue manager: where jobs are dispatched, over named connections."""

from __future__ import annotations

import enum
import itertools
import logging
import os
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

from . import _clock, signals
from .batch import Batch, PendingBatch, RecordedBatch
from .chain import PendingChain, RecordedChain
from .container import Container
from .coordination import Coordination, store_of
from .drivers.extensions import DispatchesWithin, StreamsPush
from .errors import (
    ConfigurationError,
    NoQueueConfiguredError,
    UniqueLockHeldError,
    UnknownConnectionError,
)
from .jobs import Job
from .outbox.dispatch import check_outbox, send_through_outbox
from .pending import PendingDispatch
from .queued import new_id, queued_job
from .recording import PushedJob, Recording, RecordingQueue, not_a_fake
from .registry import JobRegistry
from .types import QueuedJob, Result
from .unique import admit_within, release, release_within

if TYPE_CHECKING:
    from .config import Booted, QueueResources
    from .drivers.base import BaseQueue
    from .drivers.database.outbox import Outbox
    from .fleet import MinuteCounts, WorkerInfo
    from .schedule import Schedule
    from .state.base import LockStore

__all__ = [
    "QueueManager",
    "FakeQueueManager",
    "PendingDispatch",
    "OWN_STORE",
    "instance",
    "set_instance",
    "dispatch",
]

log = logging.getLogger("rainier_sync")


class _Own(enum.Enum):
    STORE = "own"

    def __repr__(self) -> str:
        return "OWN_STORE"


#: ``locks=`` left out: the store in the default connection's own backend
#: (:func:`rainier_sync.coordination.store_of`), or none where it cannot hold one.
OWN_STORE: Literal[_Own.STORE] = _Own.STORE

#: Jobs per slice when a driver stores a batch as it is built.
_SLICE = 200


class QueueManager:
    """Dispatches jobs to named connections (one driver each).

    ``connections`` maps names to drivers; ``default`` names the one used when
    a dispatch names none. A connection nobody declared is an error, never the
    default. ``locks`` is the lock store every process shares for unique jobs,
    paused queues, batches, chains, results, the schedule and the workers'
    records; left out, it is the one in the default connection's own backend
    (memory, database, Redis; Kafka's lease store: see
    :func:`rainier_sync.coordination.store_of`), and on SQS and sync there is none, so
    what needs one raises naming ``locks``. ``locks=None`` says "no store" on any
    driver. ``outbox`` is where a
    dispatch ``.within(conn)`` to a connection that cannot write in the caller's
    transaction (Redis, SQS, Kafka) puts its job (see :mod:`rainier_sync.outbox`).
    """

    def __init__(
        self,
        connections: Mapping[str, BaseQueue] | None = None,
        default: str | None = None,
        registry: JobRegistry | None = None,
        container: Container | None = None,
        locks: LockStore | None | Literal[_Own.STORE] = OWN_STORE,
        schedule: Schedule | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.registry = registry if registry is not None else JobRegistry()
        self.container = container if container is not None else Container()
        self.locks: LockStore | None = None if locks is OWN_STORE else locks
        #: Paused queues, batches, chains and results, kept in ``locks``.
        self._coordination = Coordination(self, said_no_store=locks is None)
        #: The periodic jobs a scheduling worker or ``schedule:run`` dispatches.
        self.schedule = schedule
        if schedule is not None:
            for entry in schedule:
                if self.registry.find(type(entry.job).NAME) is None:
                    raise ConfigurationError(
                        f"schedule entry {entry.name!r}: job {type(entry.job).NAME!r} is not registered"
                    )
        self._connections: dict[str, BaseQueue] = dict(connections or {})
        if default is None and len(self._connections) == 1:
            default = next(iter(self._connections))
        if self._connections and default not in self._connections:
            declared = ", ".join(sorted(self._connections)) or "none"
            raise UnknownConnectionError(f"default connection {default!r} is not declared (declared: {declared})")
        self.default: str | None = default
        if locks is OWN_STORE and default is not None:
            self.locks = store_of(self._connections[default])
        #: Where dispatches go instead of the drivers (see :meth:`route_sends`).
        self._router: Callable[[str | None, list[QueuedJob]], list[str | None]] | None = None
        #: The outbox dispatches within a caller's transaction go to, for drivers that cannot write in it.
        self.outbox = outbox
        if outbox is not None:
            check_outbox(outbox, self._connections)
        for name, driver in self._connections.items():
            driver.bind(self, name)

    # -- booting -------------------------------------------------------------------
    @classmethod
    def from_env(
        cls,
        registry: JobRegistry | None = None,
        container: Container | None = None,
        *,
        resources: QueueResources | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> QueueManager:
        """Boot from ``QUEUE_DRIVER`` and the settings beside it (unset: a manager
        with no connection, on which dispatching raises ``NoQueueConfiguredError``),
        and make it the process-wide manager."""
        from .config import build_from_env

        return cls._over(build_from_env(registry=registry, container=container, resources=resources, environ=environ))

    @classmethod
    def from_config(
        cls,
        config: Any,
        registry: JobRegistry | None = None,
        container: Container | None = None,
        *,
        resources: QueueResources | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> QueueManager:
        """Boot from a ``queues`` section (a dict, a JSON or TOML file path, or
        :class:`~rainier_sync.Connections`) and make it the process-wide manager."""
        from .config import build_from_config

        return cls._over(
            build_from_config(config, registry=registry, container=container, resources=resources, environ=environ)
        )

    @classmethod
    def _over(cls, booted: Booted) -> QueueManager:
        try:
            manager = cls(
                connections=booted.connections,
                default=booted.default,
                registry=booted.registry,
                container=booted.container,
                locks=booted.locks if booted.locks is not None else OWN_STORE,
                outbox=booted.outbox,
            )
        except BaseException:
            booted.close()
            raise
        set_instance(manager)
        return manager

    @classmethod
    def fake(cls, registry: JobRegistry | None = None) -> FakeQueueManager:
        """A manager that records dispatches instead of performing them."""
        return FakeQueueManager(registry=registry)

    # -- connections ---------------------------------------------------------------
    @property
    def connections(self) -> dict[str, BaseQueue]:
        return dict(self._connections)

    def connection(self, name: str | None = None) -> BaseQueue:
        """The driver declared as ``name`` (the default when None)."""
        if name is None:
            name = self.default
            if name is None:
                raise NoQueueConfiguredError(
                    "no queue is configured: set QUEUE_DRIVER or a queues section, or build a QueueManager "
                    "with connections"
                )
        try:
            return self._connections[name]
        except KeyError:
            declared = ", ".join(sorted(self._connections)) or "none"
            raise UnknownConnectionError(f"connection {name!r} is not declared (declared: {declared})") from None

    def close(self) -> None:
        for driver in self._connections.values():
            driver.close()
        if self.locks is not None:
            self.locks.close()
        if self.outbox is not None:
            self.outbox.close()

    # -- batches, chains, paused queues, the fleet, results (coordination.py) ---------------
    def batch(self, jobs: Sequence[Job], name: str | None = None) -> PendingBatch:
        """A batch of jobs counted as one piece of work: ``manager.batch(jobs,
        name=...).then(J()).catch(F()).finally_(C()).dispatch()`` returns a :class:`Batch`."""
        return self._coordination.batch(jobs, name)

    def find_batch(self, batch_id: str) -> Batch | None:
        """The batch as stored now, or None (never made, or expired)."""
        return self._coordination.find_batch(batch_id)

    def batches(self, limit: int = 100) -> list[Batch]:
        """The batches still kept, newest first."""
        return self._coordination.batches(limit)

    def cancel_batch(self, batch_id: str) -> bool:
        """Cancel a batch: its jobs not yet started are skipped. False when there is no such batch."""
        return self._coordination.cancel_batch(batch_id)

    def chain(self, jobs: Sequence[Job | PendingDispatch]) -> PendingChain:
        """A chain of jobs, each run only after the one before it succeeded:
        ``manager.chain([A(), B()]).catch(Failed()).dispatch()`` returns the chain's id."""
        return self._coordination.chain(jobs)

    def pause(self, queue: str, connection: str | None = None) -> None:
        """Stop every worker of ``connection`` (the default), in any process, from
        claiming jobs of ``queue`` (within its ``sleep``); running jobs finish and
        dispatching still works. Kept in the lock store the workers share."""
        self._coordination.pause(queue, connection)

    def resume(self, queue: str, connection: str | None = None) -> None:
        """Let workers claim from a paused ``queue`` again."""
        self._coordination.resume(queue, connection)

    def paused(self, connection: str | None = None) -> set[str]:
        """The paused queues of ``connection`` (the default); empty without a
        lock store, where no queue can be paused."""
        return self._coordination.paused(connection)

    def workers(self, connection: str | None = None) -> list[WorkerInfo]:
        """The workers of ``connection`` (every connection when None), in any
        process, as they last recorded themselves in the lock store: a record
        lapses about 30 s after its worker stopped refreshing it. Without a lock
        store, a ConfigurationError naming ``locks``."""
        return self._coordination.workers(connection)

    def throughput(self, connection: str | None = None, minutes: int = 60) -> list[MinuteCounts]:
        """What the workers of ``connection`` (every connection when None), in
        any process, finished in each of the last ``minutes`` minutes, oldest
        first (kept two hours). Without a lock store, a ConfigurationError naming ``locks``."""
        return self._coordination.throughput(connection, minutes)

    def result(self, job_id: str, wait: float | None = None) -> Result:
        """The result of a job whose class keeps results (``KEEP_RESULT``):
        ``Result(status, value, error)``, status ``pending``, ``processed``,
        ``failed`` or ``unknown``. With ``wait``, waits up to that many seconds
        while it is pending (woken when it finishes where the store can)."""
        return self._coordination.result(job_id, wait)

    def _store(self, what: str) -> LockStore:
        """The lock store, for ``what``; without one a ConfigurationError naming ``locks``."""
        return self._coordination.store(what)

    def _keeps(self, jobs: list[QueuedJob]) -> bool:
        return self._coordination.keeps(jobs)

    def _mark_pending(self, jobs: list[QueuedJob], *, gone: bool = False) -> None:
        self._coordination.mark_pending(jobs, gone=gone)

    # -- dispatching -----------------------------------------------------------------
    def pending(self, job: Job) -> PendingDispatch:
        return PendingDispatch(self, job)

    def dispatch(self, job: Job) -> str | None:
        """Queue ``job`` on its own ``QUEUE``; its id, or None for a dropped duplicate."""
        name = self.default
        return self._send(name, [self.build(job, connection=name)])[0]

    def dispatch_on(self, queue: str, job: Job) -> str | None:
        return self.pending(job).on_queue(queue).send()

    def dispatch_after(self, delay: float | timedelta, job: Job) -> str | None:
        return self.pending(job).delay(delay).send()

    def dispatch_many(self, jobs: Iterable[Job]) -> list[str | None]:
        """Queue several jobs on the default connection, one round trip per
        batch where the backend allows; ids in order (None for dropped duplicates)."""
        return self._dispatch_many(list(jobs))

    def _dispatch_many(
        self, jobs: list[Job], *, queue: str | None = None, meta: dict[str, Any] | None = None
    ) -> list[str | None]:
        """:meth:`dispatch_many`, on ``queue`` (else each job's ``QUEUE``), each job
        carrying a copy of ``meta`` (a batch's jobs, its id)."""
        name = self.default
        driver = self.connection(name)
        # Unique jobs take their locks, and jobs that keep results their pending marks,
        # before anything is stored: the lock store may share the very connection a
        # stream is writing on.
        if (
            driver.capabilities.streaming_push
            and self._router is None
            and not any(type(job).unique_id is not Job.unique_id or type(job).KEEP_RESULT is not None for job in jobs)
        ):
            return self._stream(name, jobs, StreamsPush.of(driver).push_stream, queue, meta)
        return self._send(name, self._build_many(jobs, name, queue, meta))

    def dispatch_now(self, job: Job) -> str:
        """Run ``job`` now, in this thread, with its retries (no backoff sleep);
        a final failure raises."""
        from .execution import Executor

        queued = self.build(job, connection="now")
        try:
            return Executor(
                self.registry, self.container, locks=self.locks, sender=self, dispatcher=self
            ).run_inline(queued)
        finally:
            if queued.unique_key is not None and self.locks is not None and queued.unique_owner:
                self.locks.release(queued.unique_key, queued.unique_owner)

    def retry_failed(self, id: str, connection: str | None = None) -> bool:
        """Queue a failed job again (attempts reset); False when no failed job has ``id``.

        A unique job takes its lock again first, so a fresh dispatch of the same
        job is dropped as a duplicate while the retried one is queued. When a live
        copy holds the lock, :class:`~rainier_sync.errors.UniqueLockHeldError` says
        so and the failed entry stays where it is. A failed job of a batch goes back
        to pending in its batch's counts first (:func:`rainier_sync.batch.retry`).
        """
        driver = self.connection(connection)
        failed = driver.failed_job(id)
        queued = failed.job if failed is not None else None
        if queued is not None and queued.meta and "batch" in queued.meta and self.locks is not None:
            from .batch import retry

            return retry(self.locks, driver, queued, lambda again: self._retry(id, queued, again))
        return self._retry(id, queued, driver.retry_failed)

    def _retry(self, id: str, queued: QueuedJob | None, again: Callable[[str], bool]) -> bool:
        """``again(id)``, the driver's retry of failed job ``id`` (``queued``), a unique
        one holding its lock again first."""
        if queued is None or queued.unique_key is None or self.locks is None:
            return again(id)
        key = queued.unique_key
        owner = queued.unique_owner = queued.unique_owner or new_id()
        if not self.locks.acquire(key, owner, queued.unique_for or 3600):
            raise UniqueLockHeldError(
                f"failed job {id} ({queued.name}) was not retried: it is unique ({key}) and a copy of it is queued "
                "or running now; its failed entry is kept"
            )
        try:
            retried = again(id)
        except BaseException:
            release(self.locks, [queued])
            raise
        if not retried:
            release(self.locks, [queued])
        return retried

    def send_queued(self, connection: str | None, jobs: list[QueuedJob], *, within: Any = None) -> list[str | None]:
        """Queue jobs already built (by :meth:`build`: a pending dispatch's, a timeout
        child's) on ``connection``, in the caller's transaction when ``within``:
        unique locks taken here, ids as ``dispatch_many`` gives them."""
        return self._send(connection, jobs, within=within)

    def stage_queued(self, connection: str | None, jobs: list[QueuedJob]) -> None:
        """What a dispatch does before its driver stores jobs, for jobs a driver
        stores in a transaction of its own (a chain's next link, inserted as its
        worker acknowledges the link before it): the ``job_dispatching`` signal,
        the pending marks of jobs that keep results. Not for unique jobs, whose
        locks only :meth:`send_queued` takes."""
        if signals.job_dispatching.receivers:
            signals.emit(signals.job_dispatching, self, jobs=jobs, connection=connection or self.default)
        if self.registry.keeping_results() and self._keeps(jobs):
            self._mark_pending(jobs)

    def route_sends(self, router: Callable[[str | None, list[QueuedJob]], list[str | None]] | None) -> None:
        """Hand every dispatch of this manager to ``router(connection, jobs)``
        instead of its drivers (None: stop). A timeout child routes its jobs'
        dispatches to the worker this way; a dispatch ``within`` a caller's
        transaction is never routed."""
        self._router = router

    # -- internals -------------------------------------------------------------------
    def build(
        self,
        job: Job,
        *,
        queue: str | None = None,
        delay: float = 0.0,
        tries: int | None = None,
        priority: int | None = None,
        connection: str | None = None,
    ) -> QueuedJob:
        """The QueuedJob a dispatch would store (payload checked, nothing sent)."""
        return self._build(job, _clock.now(), new_id(), queue, delay, tries, priority, connection)

    def _build_many(
        self,
        jobs: Iterable[Job],
        connection: str | None,
        queue: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> list[QueuedJob]:
        """:meth:`build` for a batch: one clock reading, ids drawn together."""
        jobs = list(jobs)
        now = _clock.now()
        hex_ids = os.urandom(16 * len(jobs)).hex()
        build = self._build
        built = [
            build(job, now, hex_ids[32 * index : 32 * index + 32], queue, 0.0, None, None, connection)
            for index, job in enumerate(jobs)
        ]
        if meta:
            for queued in built:
                queued.meta = dict(meta)
        return built

    def _build(
        self,
        job: Job,
        now: float,
        job_id: str,
        queue: str | None,
        delay: float,
        tries: int | None,
        priority: int | None,
        connection: str | None,
    ) -> QueuedJob:
        return queued_job(self.registry, self.default, job, now, job_id, queue, delay, tries, priority, connection)

    def _send(self, name: str | None, jobs: list[QueuedJob], within: Any = None) -> list[str | None]:
        if self._router is not None and within is None:
            return self._router(name, jobs)
        driver = self.connection(name)
        if within is not None and not driver.capabilities.transactional_dispatch:
            return send_through_outbox(self, name, driver, jobs, within)
        if signals.job_dispatching.receivers:
            signals.emit(signals.job_dispatching, self, jobs=jobs, connection=name or self.default)
        keeping = self.registry.keeping_results() and self._keeps(jobs)
        ids: list[str | None] = []
        locked: list[QueuedJob] = []
        held: list[tuple[str, str]] = []  # taken in the caller's transaction
        to_push = admit_within(self.locks, driver, within, jobs, ids, locked, held)
        if not to_push:
            return ids
        if keeping:  # before the push: a worker (or the sync driver) may finish the job before it returns
            self._mark_pending(to_push)
        try:
            if within is not None:
                DispatchesWithin.of(driver).push_within(within, to_push)
            elif len(to_push) == 1:
                driver.push(to_push[0])
            else:
                driver.push_many(to_push)
        except BaseException:
            release(self.locks, locked)
            release_within(driver, within, held)
            if keeping:
                self._mark_pending(to_push, gone=True)
            raise
        return ids

    def _stream(
        self,
        name: str | None,
        jobs: Iterable[Job],
        push_stream: Callable[[Any], None],
        queue: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> list[str | None]:
        """``dispatch_many`` of jobs none of which is unique or keeps a result, for a
        driver that stores a batch as it is built (``push_stream``): one slice while
        the next is built."""
        ids: list[str | None] = []
        pending = iter(jobs)

        def slices() -> Iterator[list[QueuedJob]]:
            while chunk := list(itertools.islice(pending, _SLICE)):
                built = self._build_many(chunk, name, queue, meta)
                if signals.job_dispatching.receivers:
                    signals.emit(signals.job_dispatching, self, jobs=built, connection=name or self.default)
                ids.extend(job.id for job in built)
                yield built

        push_stream(slices())
        return ids

    # -- a fake manager's assertions: on a real one, each raises, saying so ----------------
    def pushed(self, job_class: type[Job], where: Callable[[Any], bool] | None = None) -> list[QueuedJob]:
        raise not_a_fake("pushed")

    def assert_pushed(self, job_class: type[Job], where: Callable[[Any], bool] | None = None) -> None:
        raise not_a_fake("assert_pushed")

    def assert_pushed_times(self, job_class: type[Job], times: int) -> None:
        raise not_a_fake("assert_pushed_times")

    def assert_pushed_on(self, job_class: type[Job], queue: str, where: Callable[[Any], bool] | None = None) -> None:
        raise not_a_fake("assert_pushed_on")

    def assert_not_pushed(self, job_class: type[Job], where: Callable[[Any], bool] | None = None) -> None:
        raise not_a_fake("assert_not_pushed")

    def assert_nothing_pushed(self) -> None:
        raise not_a_fake("assert_nothing_pushed")

    def __repr__(self) -> str:
        return f"<QueueManager default={self.default!r} connections={sorted(self._connections)}>"


class FakeQueueManager(QueueManager):
    """Records every dispatch (payloads are still checked) and runs nothing.

    Any connection name is accepted. Unique jobs are all recorded: the fake
    has no lock store, so it never drops a duplicate.
    """

    #: Chains are recorded, not checked against the registry.
    records_only = True

    def __init__(self, registry: JobRegistry | None = None) -> None:
        super().__init__(connections={"default": RecordingQueue()}, default="default", registry=registry, locks=None)
        self.recording = Recording()
        self._jobs_by_id: dict[str, Job] = {}

    def chain(self, jobs: Sequence[Job | PendingDispatch]) -> PendingChain:
        """Records the chain when it is dispatched; nothing runs."""
        return RecordedChain(self, jobs)

    def batch(self, jobs: Sequence[Job], name: str | None = None) -> PendingBatch:
        """Records the batch when it is dispatched; nothing runs."""
        return RecordedBatch(self, jobs, name)

    def assert_batched(self, predicate: Callable[[Any], bool] | None = None) -> None:
        """A batch was dispatched that ``predicate`` (called with its :class:`PendingBatch`) accepts."""
        if not any(predicate is None or predicate(batch) for batch in self.recording.batches):
            seen = ", ".join(repr(batch) for batch in self.recording.batches) or "none"
            raise AssertionError(f"expected a matching batch; batches dispatched: {seen}")

    def assert_chained(self, expected: Sequence[type[Job] | Callable[[Any], bool]]) -> None:
        """A chain was dispatched whose links match ``expected`` (classes or predicates), in order."""
        self.recording.assert_chained(expected)

    def connection(self, name: str | None = None) -> BaseQueue:
        return self._connections["default"]

    def _build(self, job: Job, *args: Any) -> QueuedJob:
        # Every dispatch path (build, dispatch_many's batches) builds here.
        queued = super()._build(job, *args)
        self._jobs_by_id[queued.id] = job
        return queued

    def _send(self, name: str | None, jobs: list[QueuedJob], within: Any = None) -> list[str | None]:
        for queued in jobs:
            job = self._jobs_by_id.pop(queued.id)
            queued.unique_key = queued.unique_owner = None
            self.recording.pushed.append(PushedJob(job, queued, name or "default"))
        return [q.id for q in jobs]

    def dispatch_now(self, job: Job) -> str:
        queued = self.build(job, connection="now")
        return self._send("now", [queued])[0] or queued.id

    # -- reading and asserting (see :class:`~rainier_sync.recording.Recording`) ------------
    def pushed(self, job_class: type[Job], where: Callable[[Any], bool] | None = None) -> list[QueuedJob]:
        """The recorded dispatches of ``job_class`` (matching ``where``, called with the job)."""
        return self.recording.queued(job_class, where)

    def pushed_jobs(self, job_class: type[Job] | None = None) -> list[PushedJob]:
        return self.recording.pushed_jobs(job_class)

    def clear(self) -> None:
        self.recording.clear()

    def assert_pushed(self, job_class: type[Job], where: Callable[[Any], bool] | None = None) -> None:
        self.recording.assert_pushed(job_class, where)

    def assert_pushed_times(self, job_class: type[Job], times: int) -> None:
        self.recording.assert_pushed_times(job_class, times)

    def assert_pushed_on(self, job_class: type[Job], queue: str, where: Callable[[Any], bool] | None = None) -> None:
        self.recording.assert_pushed_on(job_class, queue, where)

    def assert_not_pushed(self, job_class: type[Job], where: Callable[[Any], bool] | None = None) -> None:
        self.recording.assert_not_pushed(job_class, where)

    def assert_nothing_pushed(self) -> None:
        self.recording.assert_nothing_pushed()


_instance: QueueManager | None = None
_instance_lock = threading.Lock()
_resolvers: list[Callable[[], QueueManager | None]] = []


def add_instance_resolver(resolver: Callable[[], QueueManager | None]) -> None:
    """Let an integration (Flask's current app, say) answer :func:`instance`
    first; a resolver returns None when it has no manager to offer."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def instance() -> QueueManager:
    """The process-wide manager (set by :func:`set_instance` or by booting)."""
    for resolver in _resolvers:
        found = resolver()
        if found is not None:
            return found
    manager = _instance
    if manager is None:
        raise NoQueueConfiguredError(
            "no QueueManager is set for this process: call rainier_sync.set_instance(manager) at boot"
        )
    return manager


def instance_or_none() -> QueueManager | None:
    """The manager :func:`set_instance` set for this process, or None."""
    return _instance


def set_instance(manager: QueueManager | None) -> QueueManager | None:
    """Make ``manager`` the process-wide manager; returns the previous one."""
    global _instance
    with _instance_lock:
        previous, _instance = _instance, manager
    return previous


def dispatch(job: Job) -> str | None:
    """``instance().dispatch(job)``."""
    return instance().dispatch(job)
