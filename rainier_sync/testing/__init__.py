"""Testing support: a manager that records dispatches instead of performing them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..drivers.base import BaseQueue, QueueDriver
from ..job import Job
from ..manager import QueueManager
from ..types import ExceptionInfo, FailedJob, QueuedJob

if TYPE_CHECKING:
    from ..registry import JobRegistry

__all__ = ["FakeQueueManager", "PushedJob"]

Predicate = Callable[[Any], bool]


@dataclass(frozen=True)
class PushedJob:
    """One recorded dispatch: the job object and what would have been queued."""

    job: Job
    queued: QueuedJob
    connection: str


class _Recorder(BaseQueue):
    driver = QueueDriver.MEMORY

    def __init__(self) -> None:
        self.records: list[QueuedJob] = []

    def push(self, job: QueuedJob) -> str:
        self.records.append(job)
        return job.id

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return []

    def acknowledge(self, job: QueuedJob) -> None:
        pass

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        pass

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        raise NotImplementedError("a fake queue runs nothing, so nothing fails")

    def reclaim_expired(self) -> int:
        return 0

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        pass  # nothing here is ever reserved

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        return []

    def retry_failed(self, id: str) -> bool:
        return False

    def forget_failed(self, id: str) -> bool:
        return False

    def size(self, queue: str | None = None) -> int:
        return sum(1 for r in self.records if queue is None or r.queue == queue)


class FakeQueueManager(QueueManager):
    """Records every dispatch (payloads are still checked) and runs nothing.

    Any connection name is accepted. Unique jobs are all recorded: the fake
    has no lock store, so it never drops a duplicate.
    """

    def __init__(self, registry: JobRegistry | None = None) -> None:
        super().__init__(connections={"default": _Recorder()}, default="default", registry=registry)
        self._pushed: list[PushedJob] = []
        self._jobs_by_id: dict[str, Job] = {}

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
            self._pushed.append(PushedJob(job, queued, name or "default"))
        return [q.id for q in jobs]

    def dispatch_now(self, job: Job) -> str:
        queued = self.build(job, connection="now")
        return self._send("now", [queued])[0] or queued.id

    # -- reading ------------------------------------------------------------------
    def pushed(self, job_class: type[Job], where: Predicate | None = None) -> list[QueuedJob]:
        """The recorded dispatches of ``job_class`` (matching ``where``, called with the job)."""
        return [p.queued for p in self._matching(job_class, where)]

    def pushed_jobs(self, job_class: type[Job] | None = None) -> list[PushedJob]:
        return [p for p in self._pushed if job_class is None or type(p.job) is job_class]

    def _matching(self, job_class: type[Job], where: Predicate | None) -> list[PushedJob]:
        return [p for p in self._pushed if type(p.job) is job_class and (where is None or where(p.job))]

    def clear(self) -> None:
        self._pushed.clear()

    # -- assertions -------------------------------------------------------------------
    def assert_pushed(self, job_class: type[Job], where: Predicate | None = None) -> None:
        if not self._matching(job_class, where):
            detail = " matching the predicate" if where is not None else ""
            raise AssertionError(f"expected {job_class.__qualname__} to be pushed{detail}; pushed: {self._summary()}")

    def assert_pushed_times(self, job_class: type[Job], times: int) -> None:
        found = len(self._matching(job_class, None))
        if found != times:
            raise AssertionError(f"expected {job_class.__qualname__} pushed {times} time(s), got {found}")

    def assert_pushed_on(self, job_class: type[Job], queue: str, where: Predicate | None = None) -> None:
        matching = self._matching(job_class, where)
        if not any(p.queued.queue == queue for p in matching):
            queues = sorted({p.queued.queue for p in matching})
            raise AssertionError(
                f"expected {job_class.__qualname__} pushed on queue {queue!r}; it was pushed on: {queues or 'no queue'}"
            )

    def assert_not_pushed(self, job_class: type[Job], where: Predicate | None = None) -> None:
        found = self._matching(job_class, where)
        if found:
            raise AssertionError(f"expected {job_class.__qualname__} not to be pushed; it was, {len(found)} time(s)")

    def assert_nothing_pushed(self) -> None:
        if self._pushed:
            raise AssertionError(f"expected nothing pushed; pushed: {self._summary()}")

    def _summary(self) -> str:
        if not self._pushed:
            return "nothing"
        names: dict[str, int] = {}
        for p in self._pushed:
            names[type(p.job).__qualname__] = names.get(type(p.job).__qualname__, 0) + 1
        return ", ".join(f"{n} x{c}" for n, c in names.items())
