"""What a fake manager records instead of dispatching, and the assertions over it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .drivers.base import BaseQueue, Promises
from .jobs import Job
from .types import ExceptionInfo, FailedJob, QueuedJob

__all__ = ["PushedJob", "Recording", "RecordingQueue", "not_a_fake"]

Predicate = Callable[[Any], bool]


@dataclass(frozen=True)
class PushedJob:
    """One recorded dispatch: the job object and what would have been queued."""

    job: Job
    queued: QueuedJob
    connection: str


class RecordingQueue(BaseQueue):
    """The one connection of a fake manager: it stores nothing and runs nothing."""

    #: Deferred (a worker would run what it records) and kept in this process only.
    promises = Promises(deferred=True, survives_a_restart=False)

    def __init__(self) -> None:
        self.records: list[QueuedJob] = []

    @property
    def kind(self) -> str:
        return "fake"

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


class Recording:
    """The dispatches a fake manager recorded, and what tests assert of them."""

    def __init__(self) -> None:
        self.pushed: list[PushedJob] = []
        #: Each chain dispatched: its links' jobs, in order.
        self.chains: list[list[Job]] = []
        #: Each batch dispatched (a ``PendingBatch``: ``jobs``, its name and callbacks).
        self.batches: list[Any] = []

    # -- reading ------------------------------------------------------------------
    def queued(self, job_class: type[Job], where: Predicate | None = None) -> list[QueuedJob]:
        """The recorded dispatches of ``job_class`` (matching ``where``, called with the job)."""
        return [p.queued for p in self.matching(job_class, where)]

    def pushed_jobs(self, job_class: type[Job] | None = None) -> list[PushedJob]:
        return [p for p in self.pushed if job_class is None or type(p.job) is job_class]

    def matching(self, job_class: type[Job], where: Predicate | None) -> list[PushedJob]:
        return [p for p in self.pushed if type(p.job) is job_class and (where is None or where(p.job))]

    def clear(self) -> None:
        self.pushed.clear()
        self.chains.clear()
        self.batches.clear()

    # -- assertions -------------------------------------------------------------------
    def assert_pushed(self, job_class: type[Job], where: Predicate | None = None) -> None:
        if not self.matching(job_class, where):
            detail = " matching the predicate" if where is not None else ""
            raise AssertionError(f"expected {job_class.__qualname__} to be pushed{detail}; pushed: {self.summary()}")

    def assert_pushed_times(self, job_class: type[Job], times: int) -> None:
        found = len(self.matching(job_class, None))
        if found != times:
            raise AssertionError(f"expected {job_class.__qualname__} pushed {times} time(s), got {found}")

    def assert_pushed_on(self, job_class: type[Job], queue: str, where: Predicate | None = None) -> None:
        matching = self.matching(job_class, where)
        if not any(p.queued.queue == queue for p in matching):
            queues = sorted({p.queued.queue for p in matching})
            raise AssertionError(
                f"expected {job_class.__qualname__} pushed on queue {queue!r}; it was pushed on: {queues or 'no queue'}"
            )

    def assert_not_pushed(self, job_class: type[Job], where: Predicate | None = None) -> None:
        found = self.matching(job_class, where)
        if found:
            raise AssertionError(f"expected {job_class.__qualname__} not to be pushed; it was, {len(found)} time(s)")

    def assert_nothing_pushed(self) -> None:
        if self.pushed:
            raise AssertionError(f"expected nothing pushed; pushed: {self.summary()}")

    def assert_chained(self, expected: Sequence[type[Job] | Predicate]) -> None:
        """A chain was dispatched whose links match ``expected`` in order: each a
        job class (its exact type) or a predicate called with the job."""

        def fits(job: Job, want: type[Job] | Predicate) -> bool:
            return type(job) is want if isinstance(want, type) else bool(want(job))

        for chain in self.chains:
            if len(chain) == len(expected) and all(fits(j, w) for j, w in zip(chain, expected, strict=True)):
                return
        seen = [" -> ".join(type(j).__qualname__ for j in chain) for chain in self.chains]
        raise AssertionError(
            f"expected a chain of {len(expected)} matching job(s); chains dispatched: {seen or 'none'}"
        )

    def summary(self) -> str:
        if not self.pushed:
            return "nothing"
        names: dict[str, int] = {}
        for p in self.pushed:
            names[type(p.job).__qualname__] = names.get(type(p.job).__qualname__, 0) + 1
        return ", ".join(f"{n} x{c}" for n, c in names.items())


def not_a_fake(name: str) -> AssertionError:
    """The error an assertion of a fake manager raises on a real one."""
    return AssertionError(
        f"{name}() needs QueueManager.fake(); this is a real QueueManager, which records nothing, "
        "so the assertion would pass or fail for the wrong reason"
    )
