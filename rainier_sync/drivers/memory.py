"""The memory driver: jobs held in this process, for tests and development."""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterator, Sequence, TypeVar

from .. import _clock
from ..state.memory import MemoryLockStore
from ..types import (
    ExceptionInfo,
    FailedJob,
    JobState,
    ListedJob,
    QueueCounts,
    QueuedJob,
    as_exception_info,
    decode,
    encode,
)
from .base import BaseQueue, Binding, Capabilities, Promises, QueueDriver, Waker, as_job_list
from .extensions import LendsLocks, ListsJobs
from .paging import Page, check_page, folded, name_filter
from .spec import DriverSpec, Setting, seconds

if TYPE_CHECKING:
    from ..container import Container
    from ..registry import JobRegistry

__all__ = ["MemoryQueue"]

_T = TypeVar("_T")


#: What the memory driver promises about the jobs it accepts.
PROMISES = Promises(survives_a_restart=False)


class MemoryQueue(BaseQueue, ListsJobs, LendsLocks):
    """Jobs in this process's memory. Honours delays, priority, backoff and
    reservations like every deferred driver, and loses everything when the
    process exits.

    ``jobs`` lists what is queued (ready, delayed and reserved), ``failed`` is
    the dead-letter list, and :meth:`drain` runs what is due in the calling
    thread, for tests. :meth:`list_jobs` and :meth:`find_job` read them as the
    dashboard does.
    """

    driver = QueueDriver.MEMORY
    #: The most ready or delayed jobs a name filter looks at, from the first (as on the database and Redis).
    listing_scan = 10_000
    promises = PROMISES
    capabilities = Capabilities(give_back=True, wakes=True, listing=True, lends_locks=True)
    #: The store of :meth:`lock_store`, made on first use.
    _lock_store: MemoryLockStore | None = None

    def __init__(self, reservation: float = 90) -> None:
        if isinstance(reservation, bool) or not isinstance(reservation, (int, float)) or reservation <= 0:
            raise ValueError(f"reservation must be a positive number of seconds, got {reservation!r}")
        self.reservation: float = float(reservation)
        self._mutex = threading.Lock()
        self._seq = itertools.count()
        self._receipts = itertools.count(1)
        self._jobs: dict[str, QueuedJob] = {}
        self._ready: dict[str, list[tuple[int, float, int, str]]] = {}
        self._delayed: dict[str, list[tuple[float, int, str]]] = {}
        self._reserved: dict[str, tuple[int, float]] = {}
        self._waiters: set[Waker] = set()
        self.failed: list[FailedJob] = []
        self._manager: Binding | None = None

    def bind(self, manager: Binding, connection: str) -> None:
        super().bind(manager, connection)
        self._manager = manager

    def lock_store(self) -> MemoryLockStore:
        """The store in this process's memory, one per queue: every manager over it sees the same state."""
        with self._mutex:
            if self._lock_store is None:
                self._lock_store = MemoryLockStore()
            return self._lock_store

    # -- producing -----------------------------------------------------------
    def _enqueue(self, job: QueuedJob, now: float) -> None:
        seq = next(self._seq)
        self._jobs[job.id] = job
        if job.available_at <= now:
            heapq.heappush(self._ready.setdefault(job.queue, []), (job.priority, job.available_at, seq, job.id))
        else:
            heapq.heappush(self._delayed.setdefault(job.queue, []), (job.available_at, seq, job.id))

    def push(self, job: QueuedJob) -> str:
        self.push_many([job])
        return job.id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        now = _clock.now()
        with self._mutex:
            for job in jobs:
                stored = job.copy()
                stored.payload = decode(encode(job.payload))  # kept as JSON keeps it, like every other driver
                stored.connection = self.connection
                self._enqueue(stored, now)
            waiters = list(self._waiters)
        for waker in waiters:
            waker.set()
        return [job.id for job in jobs]

    # -- consuming -----------------------------------------------------------
    def _promote(self, queue: str, now: float) -> None:
        delayed = self._delayed.get(queue)
        if not delayed:
            return
        ready = self._ready.setdefault(queue, [])
        while delayed and delayed[0][0] <= now:
            _, seq, job_id = heapq.heappop(delayed)
            job = self._jobs.get(job_id)
            if job is not None and job.id not in self._reserved:
                heapq.heappush(ready, (job.priority, job.available_at, seq, job_id))

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        now = _clock.now()
        taken: list[QueuedJob] = []
        with self._mutex:
            for queue in queues:
                self._promote(queue, now)
                ready = self._ready.get(queue)
                while ready and len(taken) < limit:
                    _, _, _, job_id = heapq.heappop(ready)
                    job = self._jobs.get(job_id)
                    if job is None or job_id in self._reserved:
                        continue
                    job.attempts += 1
                    receipt = next(self._receipts)
                    self._reserved[job_id] = (receipt, now + self.reservation)
                    handed = job.copy(receipt)
                    handed.payload = decode(encode(job.payload))  # an attempt cannot alter what a retry sees
                    taken.append(handed)
                if len(taken) >= limit:
                    break
        return taken

    def _holds(self, job: QueuedJob) -> bool:
        held = self._reserved.get(job.id)
        return held is not None and held[0] == job.receipt

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        with self._mutex:
            for job in jobs:
                held = self._reserved.get(job.id)
                if held is not None and held[0] != job.receipt:
                    continue  # reclaimed and reserved again by another worker: theirs now
                self._reserved.pop(job.id, None)
                self._jobs.pop(job.id, None)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs go back at once, without counting their attempt."""
        self._put_back(jobs, 0.0)

    def defer(self, job: QueuedJob, delay: float) -> None:
        self._put_back([job], delay)

    def _put_back(self, jobs: Sequence[QueuedJob], delay: float) -> None:
        now = _clock.now()
        with self._mutex:
            for job in jobs:
                if not self._holds(job):
                    continue
                del self._reserved[job.id]
                stored = self._jobs.pop(job.id)
                stored.attempts = max(0, stored.attempts - 1)
                if delay > 0:
                    stored.available_at = now + delay
                self._enqueue(stored, now)
            waiters = list(self._waiters)
        for waker in waiters:
            waker.set()

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        now = _clock.now()
        with self._mutex:
            if not self._holds(job):
                return
            del self._reserved[job.id]
            stored = self._jobs[job.id]
            stored.available_at = now + max(0.0, float(delay))
            del self._jobs[job.id]
            self._enqueue(stored, now)
            waiters = list(self._waiters)
        for waker in waiters:
            waker.set()

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        info = as_exception_info(error)
        failed = FailedJob.of(replace(job, receipt=None), info, _clock.now())
        with self._mutex:
            if job.id in self._reserved and not self._holds(job):
                return failed  # reclaimed and reserved again: that worker's attempt decides
            self._reserved.pop(job.id, None)
            self._jobs.pop(job.id, None)
            self.failed.append(failed)
        return failed

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        until = _clock.now() + (self.reservation if seconds is None else seconds)
        with self._mutex:
            for job in as_job_list(jobs):
                if self._holds(job):
                    self._reserved[job.id] = (job.receipt, until)

    def reclaim_expired(self) -> int:
        now = _clock.now()
        reclaimed = 0
        with self._mutex:
            for job_id, (_, until) in list(self._reserved.items()):
                if until <= now:
                    del self._reserved[job_id]
                    job = self._jobs.pop(job_id, None)
                    if job is not None:
                        job.available_at = now
                        self._enqueue(job, now)
                        reclaimed += 1
            waiters = list(self._waiters) if reclaimed else []
        for waker in waiters:
            waker.set()
        return reclaimed

    # -- the failed store -----------------------------------------------------
    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        with self._mutex:
            return list(reversed(self.failed))[:limit]

    def failed_count(self) -> int:
        return len(self.failed)

    def _take_failed(self, id: str) -> FailedJob | None:
        """Remove and return a failed job; newest first, as ``retry all`` walks them."""
        with self._mutex:
            for index in range(len(self.failed) - 1, -1, -1):
                if self.failed[index].id == id:
                    return self.failed.pop(index)
        return None

    def retry_failed(self, id: str) -> bool:
        failed = self._take_failed(id)
        if failed is None:
            return False
        job = failed.job or QueuedJob(id=failed.id, name=failed.name, queue=failed.queue, payload=failed.payload)
        self.push(replace(job, attempts=0, available_at=_clock.now()))
        return True

    def forget_failed(self, id: str) -> bool:
        return self._take_failed(id) is not None

    # -- inspection --------------------------------------------------------------
    @property
    def jobs(self) -> list[QueuedJob]:
        """Every queued job (ready, delayed and reserved), oldest first."""
        with self._mutex:
            return list(self._jobs.values())

    def size(self, queue: str | None = None) -> int:
        with self._mutex:
            if queue is None:
                return len(self._jobs)
            return sum(1 for job in self._jobs.values() if job.queue == queue)

    def counts(self, queue: str) -> QueueCounts:
        now = _clock.now()
        ready = delayed = reserved = 0
        with self._mutex:
            for job in self._jobs.values():
                if job.queue != queue:
                    continue
                if job.id in self._reserved:
                    reserved += 1
                elif job.available_at > now:
                    delayed += 1
                else:
                    ready += 1
        return QueueCounts(ready=ready, delayed=delayed, reserved=reserved)

    def queue_names(self) -> list[str]:
        with self._mutex:
            return sorted({job.queue for job in self._jobs.values()} | {f.queue for f in self.failed})

    def _state(self, job: QueuedJob, now: float) -> JobState:
        if job.id in self._reserved:
            return "reserved"
        return "delayed" if job.available_at > now else "ready"

    def _listed(self, job: QueuedJob, state: JobState) -> ListedJob:
        """A copy of a stored job (``_mutex`` held): what the caller does with it leaves the queue alone."""
        listed = job.copy()
        listed.payload = decode(encode(job.payload))
        if job.meta:
            listed.meta = decode(encode(job.meta))
        held = self._reserved.get(job.id) if state == "reserved" else None
        return ListedJob(listed, state, held[1] if held is not None else None)

    def list_jobs(
        self, queue: str, state: JobState, *, name: str | None = None, offset: int = 0, limit: int = 50
    ) -> Page:
        """A page of ``queue``'s jobs in ``state``: ``ready`` in the order a worker takes
        them (priority, then due time, then dispatch), ``delayed`` by due time,
        ``reserved`` by when their reservation lapses. Ready and delayed jobs are
        walked in order from the queue's heaps, so a page costs about its own
        length; the reserved ones are read from what is held. ``name`` keeps the
        jobs whose ``NAME`` contains it, ignoring the case of A to Z, among the
        first :attr:`listing_scan` ready or delayed jobs, as the database and
        Redis drivers do (the :class:`~rainier_sync.drivers.paging.Page` says when
        it stopped there)."""
        state = check_page(state, offset, limit)
        needle = name_filter(name)
        wanted = folded(needle) if needle is not None else None
        now = _clock.now()
        page = Page()
        with self._mutex:
            if state == "reserved":  # what is reserved is what is running: few, wherever the rest are
                held = sorted((until, receipt, job_id) for job_id, (receipt, until) in self._reserved.items())
                jobs: Iterator[QueuedJob] = (self._jobs[job_id] for _, _, job_id in held if job_id in self._jobs)
                jobs = (job for job in jobs if job.queue == queue)
            else:
                jobs = self._ready_in_order(queue, now) if state == "ready" else self._delayed_in_order(queue, now)
                if wanted is not None:
                    page.bound = bound = max(1, int(self.listing_scan))
                    looked = [0]

                    def counted(walk: Iterator[QueuedJob]) -> Iterator[QueuedJob]:
                        for job in walk:
                            if looked[0] == bound:
                                page.complete = False
                                return
                            looked[0] += 1
                            yield job

                    jobs = counted(jobs)
            if wanted is not None:
                jobs = (job for job in jobs if wanted in folded(job.name))
            page.extend(self._listed(job, state) for job in itertools.islice(jobs, offset, offset + limit))
            return page

    def _ready_in_order(self, queue: str, now: float) -> Iterator[QueuedJob]:
        """``queue``'s ready jobs in the order a worker takes them (``_mutex`` held):
        the ready heap, merged with the delayed jobs already due (moved at the next reserve)."""
        due = []
        for at, seq, job_id in _in_order(self._delayed.get(queue, [])):
            if at > now:
                break
            job = self._jobs.get(job_id)
            if job is not None:
                due.append((job.priority, at, seq, job_id))
        due.sort()
        seen: set[str] = set()
        for _, _, _, job_id in heapq.merge(_in_order(self._ready.get(queue, [])), due):
            job = self._jobs.get(job_id)
            if job is not None and job_id not in self._reserved and job_id not in seen:
                seen.add(job_id)
                yield job

    def _delayed_in_order(self, queue: str, now: float) -> Iterator[QueuedJob]:
        """``queue``'s delayed jobs by due time (``_mutex`` held)."""
        for at, _, job_id in _in_order(self._delayed.get(queue, [])):
            job = self._jobs.get(job_id)
            if at > now and job is not None and job_id not in self._reserved and job.available_at == at:
                yield job

    def find_job(self, id: str) -> ListedJob | None:
        """The stored job ``id`` (ready, delayed or reserved), or None."""
        now = _clock.now()
        with self._mutex:
            job = self._jobs.get(id)
            return None if job is None else self._listed(job, self._state(job, now))

    # -- waiting -------------------------------------------------------------------
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        with self._mutex:
            self._waiters.add(waker)
            now = _clock.now()
            soonest = min((self._delayed[q][0][0] for q in queues if self._delayed.get(q)), default=None)
        try:
            if soonest is not None:
                timeout = min(timeout, max(0.0, soonest - now))
            waker.wait(timeout)
        finally:
            with self._mutex:
                self._waiters.discard(waker)

    # -- running in the calling thread -------------------------------------------------
    def drain(self, registry: JobRegistry | None = None, container: Container | None = None) -> int:
        """Run every due job in this thread, one at a time; returns how many
        attempts ran. Delayed and backed-off jobs stay queued until due."""
        from ..execution import Executor
        from ..pending import Dispatcher

        manager = self._manager
        registry = registry or (manager.registry if manager is not None else None)
        container = container or (manager.container if manager is not None else None)
        if registry is None or container is None:
            raise ValueError("drain() needs a registry and a container: bind this queue to a QueueManager or pass them")
        from ..container import Container as _Container

        executor = Executor(
            registry,
            container if container is not None else _Container(),
            locks=manager.locks if manager is not None else None,
            sender=self,
            dispatcher=manager if isinstance(manager, Dispatcher) else None,
        )
        ran = 0
        while True:
            with self._mutex:
                queues = sorted(self._ready.keys() | self._delayed.keys())
            job = self._reserve_best(queues)
            if job is None:
                return ran
            ran += 1
            completion = executor.run(job)
            executor.apply(self, completion)
            if completion.interrupted and completion.exception is not None:
                raise completion.exception  # Ctrl-C, or a job's sys.exit(), ends the drain

    def _reserve_best(self, queues: Sequence[str]) -> QueuedJob | None:
        """The due job of lowest priority, then earliest, across ``queues``."""
        now = _clock.now()
        with self._mutex:
            best: str | None = None
            best_key: tuple[int, float, int, str] | None = None
            for queue in queues:
                self._promote(queue, now)
                ready = self._ready.get(queue)
                while ready and (ready[0][3] not in self._jobs or ready[0][3] in self._reserved):
                    heapq.heappop(ready)
                if ready and (best_key is None or ready[0] < best_key):
                    best, best_key = queue, ready[0]
        return self.reserve_many([best], 1)[0] if best is not None else None


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> MemoryQueue:
    return MemoryQueue(**settings)


SPEC = DriverSpec(
    promises=PROMISES,
    name="memory",
    rank=1,
    build=_build,
    settings={"reservation": Setting(seconds(), env=("QUEUE_RESERVATION",))},
    period="reservation",
    default_period=90,
)


def _in_order(heap: list[_T]) -> Iterator[_T]:
    """The items of ``heap`` smallest first, read without changing it: each step
    costs the log of the items yielded so far, not of the heap."""
    if not heap:
        return
    frontier: list[tuple[_T, int]] = [(heap[0], 0)]
    size = len(heap)
    while frontier:
        item, at = heapq.heappop(frontier)
        yield item
        for child in (2 * at + 1, 2 * at + 2):
            if child < size:
                heapq.heappush(frontier, (heap[child], child))
