"""The Redis driver's consumer session: one owning loop's consumer operations."""

from __future__ import annotations

from collections.abc import Sequence

from ...types import ExceptionInfo, FailedJob, QueuedJob
from ..base import ConsumerSession, Waker
from .counting import CountItem, _Counting
from .reading import _LoopState


class RedisSession(ConsumerSession):
    """The consumer operations as one owning loop holds them: the wake-ups it has
    seen and its blocking read are its own. Closing it ends that read and hands
    back, uncounted, what the read took; the driver stays open."""

    driver: _Counting

    def __init__(self, driver: _Counting) -> None:
        self.driver = driver
        self.capabilities = driver.capabilities
        self._state = _LoopState(driver._generation)

    def describe(self) -> str:
        return self.driver.describe()

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self.driver._reserve(self._state, queues, limit)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        self.driver._wait(self._state, queues, timeout, waker)

    def acknowledge(self, job: QueuedJob) -> None:
        self.driver.acknowledge(job)

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        self.driver.acknowledge_many(jobs)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        self.driver.give_back(jobs)

    def defer(self, job: QueuedJob, delay: float) -> None:
        self.driver.defer(job, delay)

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self.driver.release(job, delay)

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        return self.driver.fail(job, error)

    def acknowledge_counting(
        self, done: Sequence[QueuedJob], counts: Sequence[CountItem], queues: Sequence[str], limit: int
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        return self.driver._acknowledge_counting(self._state, done, counts, queues, limit)

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        self.driver.extend(jobs, seconds)

    def reclaim_expired(self) -> int:
        return self.driver.reclaim_expired()

    def close(self) -> None:
        self.driver._end_loop(self._state)
