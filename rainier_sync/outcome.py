"""What one attempt came to (:class:`Outcome`), and the :class:`Completion` that
carries it from the attempt to its settlement against a driver."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .types import ExceptionInfo, QueuedJob

__all__ = [
    "Outcome", "Completion", "decided", "PROCESSED", "RELEASED", "FAILED", "ABANDONED", "INTERRUPTED", "DEFERRED",
    "SKIPPED",
]  # fmt: skip


class Outcome(enum.Enum):
    """What one attempt came to, and so what is done with its job."""

    #: It succeeded: the job is acknowledged.
    PROCESSED = "processed"
    #: It failed with attempts left: the job is released for a retry after its backoff.
    RELEASED = "released"
    #: It failed for good (or could not run): the job goes to the failed store.
    FAILED = "failed"
    #: The job itself raised ``SystemExit``/``KeyboardInterrupt``: released, the try spent.
    ABANDONED = "abandoned"
    #: ``Worker.stop()`` cut it short: handed back without spending a try.
    INTERRUPTED = "interrupted"
    #: A middleware deferred it (``context.defer``): handed back, due later, without spending a try.
    DEFERRED = "deferred"
    #: A middleware skipped it (``context.skip``): acknowledged unrun.
    SKIPPED = "skipped"


PROCESSED, RELEASED, FAILED = Outcome.PROCESSED, Outcome.RELEASED, Outcome.FAILED
ABANDONED, INTERRUPTED = Outcome.ABANDONED, Outcome.INTERRUPTED
DEFERRED, SKIPPED = Outcome.DEFERRED, Outcome.SKIPPED


@dataclass(slots=True)
class Completion:
    """The outcome of one attempt, waiting to be applied to the driver."""

    job: QueuedJob
    outcome: Outcome
    delay: float = 0.0
    info: ExceptionInfo | None = None
    exception: BaseException | None = None
    duration: float = 0.0
    interrupted: bool = False
    #: The attempt that failed, when not ``job.attempts`` (a lost one: the attempt before).
    attempt: int | None = None
    #: Why a middleware deferred or skipped it.
    reason: str = ""
    #: Where the worker counts wait times for the fleet: the bucket of a first
    #: attempt's wait (:func:`rainier_sync.fleet.wait_bucket`); -1 when not.
    wait_bucket: int = -1
    #: The count this job of a batch has yet to settle (``processed``, ``failed`` or
    #: ``skipped``): a worker's owning loop settles a round's at once, before applying them.
    batch: str | None = None
    #: Jobs to store in the transaction that settles this one (a chain's next link or
    #: catch job, on a driver that ``hands_over``).
    follow: list[QueuedJob] | None = None


def decided(queued: QueuedJob, decision: tuple[str, float, str], duration: float = 0.0) -> Completion:
    """The completion of an attempt a middleware deferred or skipped."""
    kind, delay, reason = decision
    outcome = DEFERRED if kind == "defer" else SKIPPED
    return Completion(queued, outcome, delay=delay, duration=duration, reason=reason)
