"""What a worker has claimed, from the claim to its settlement.

Pool threads append finished attempts to :attr:`Claims.done`; the owning loop
collects them and applies them to the backend: the jobs of batches among them
counted first (:mod:`.counting`: all in one round trip of the lock store, or
with their acknowledgements where the driver keeps the tallies); then
acknowledgements in batches (with the next claim, where the driver can do both
in one round trip), every other outcome one call each. A settle that fails
half-way repeats only what is left, so no job is failed or announced twice. A
record the backend refuses (``PayloadError``) costs only its own job: reported
and left reserved, while the rest of the round settles.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import PayloadError
from ..execution import DEFERRED, FAILED, INTERRUPTED, PROCESSED, RELEASED, SKIPPED, Completion, Executor
from ..types import QueuedJob
from .counting import Counting
from .options import WorkerStats

if TYPE_CHECKING:
    from ..drivers.base import ConsumerSession

__all__ = ["Claims"]

log = logging.getLogger("rainier_sync")


class Claims:
    """The jobs one worker run holds, and their settlement."""

    def __init__(
        self,
        session: Callable[[], ConsumerSession],
        executor: Executor,
        stats: WorkerStats,
        *,
        report: Callable[[str, BaseException], None],
        stop: Callable[[], None],
        stopping: Callable[[], bool],
        count: Callable[[Sequence[Completion]], None] | None = None,
    ) -> None:
        self._session = session
        self._executor = executor
        self._stats = stats
        self._report = report
        self._stop = stop
        self._stopping = stopping
        #: Told of every settled completion (the worker's counts per minute for the fleet).
        self._count = count
        #: Every job claimed and not yet settled: waiting in the pool, running, or finished.
        self.running: dict[int, QueuedJob] = {}  # by the claimed object: a job id may come twice
        #: Attempts finished by pool threads, not yet seen by the owning loop.
        self.done: collections.deque[Completion] = collections.deque()
        #: Finished attempts the owning loop has yet to apply to the backend.
        self.unsettled: list[Completion] = []
        self.unsettled_since = 0.0
        #: The recent mean duration of an attempt (seconds), for sizing the prefetch.
        self.pace: float | None = None
        #: How the jobs of batches among them are counted.
        self._counting = Counting(executor, report)

    @property
    def held(self) -> bool:
        """Whether anything claimed is not settled yet."""
        return bool(self.running or self.unsettled)

    def claimed(self, jobs: Sequence[QueuedJob]) -> None:
        running = self.running
        for job in jobs:
            running[id(job)] = job

    def let_go(self, jobs: Sequence[QueuedJob]) -> None:
        """Forget jobs handed back unsettled."""
        for job in jobs:
            self.running.pop(id(job), None)

    def collect(self, now: float) -> None:
        """Move what the pool threads finished to the owning loop's own list."""
        done = self.done
        if done:
            if not self.unsettled:
                self.unsettled_since = now
            while done:
                self.unsettled.append(done.popleft())

    def settle(self, now: float) -> bool:
        """Apply every finished attempt to the backend; False when the backend failed."""
        self.collect(now)
        if not self.unsettled:
            return True
        acks = self._apply_others()
        return acks is not None and self._acknowledge(acks)

    def settle_and_claim(self, queues: Sequence[str], limit: int, *, combined: bool) -> list[QueuedJob] | None:
        """Acknowledge what finished and claim up to ``limit`` jobs, in one round
        trip when ``combined``; None when the backend failed."""
        acks = self._apply_others()
        if acks is None:
            return None
        if self._stopping():  # a job just settled stopped the worker (it raised SystemExit)
            limit = 0
        session = self._session()
        counted = any(c.batch is not None for c in acks)
        # Counted with their acknowledgements, the jobs of batches go with the claim
        # too: a driver that defers acknowledgements reads the counts' reply with it.
        if acks and limit > 0 and (combined or (counted and self._counting.with_acks(session))):
            try:
                if counted:
                    jobs, done, left = self._counting.acknowledge(session, acks, queues, limit)
                else:
                    jobs, done, left = session.acknowledge_and_reserve([c.job for c in acks], queues, limit), acks, []
            except Exception as exc:  # noqa: BLE001 - acknowledged again next time: harmless
                self._report("settle", exc)
                self.unsettled = acks + self.unsettled
                return None
            self.unsettled = left + self.unsettled
            self.announce(done)
            return jobs
        if not self._acknowledge(acks):
            return None
        if limit <= 0:
            return []
        try:
            return session.reserve_many(queues, limit)
        except Exception as exc:  # noqa: BLE001 - reported, retried by the loop with a backoff
            self._report("reserve", exc)
            return None

    def announce(self, completions: list[Completion]) -> None:
        """Announce and count completions already applied to the backend."""
        announce = self._executor.announce
        for completion in completions:
            announce(completion)
        self._account(completions)


    def _acknowledge(self, acks: list[Completion]) -> bool:
        """Acknowledge the successful attempts in one call; False (and kept to send
        again) when the backend failed."""
        if not acks:
            return True
        left: list[Completion] = []
        try:
            if any(c.batch is not None for c in acks):
                _, acks, left = self._counting.acknowledge(self._session(), acks, (), 0)
            else:
                self._session().acknowledge_many([c.job for c in acks])
        except Exception as exc:  # noqa: BLE001 - kept and retried; the reservation protects the job
            self._report("settle", exc)
            self.unsettled = acks + self.unsettled
            return False
        self.unsettled = left + self.unsettled
        self.announce(acks)
        return not left

    def _apply_others(self) -> list[Completion] | None:
        """Count the round's jobs of batches, then release or fail the attempts that
        did not succeed (and acknowledge those that hand over), one call each; returns
        the other successful ones, left to acknowledge in a batch (None when the backend failed)."""
        batch, self.unsettled = self.unsettled, []
        session = self._session()
        counting = self._counting
        if counting.with_acks(session):
            # Failed and skipped jobs of batches: each moved or acknowledged with its count, now.
            due = [c for c in batch if c.batch is not None and c.outcome is not PROCESSED]
            settled = counting.settle(session, due) if due else []
            if settled is None:
                self.unsettled = batch
                return None
            if settled:
                self.announce(settled)
                gone = {id(c) for c in settled}
                batch = [c for c in batch if id(c) not in gone]
        elif not counting.in_store(batch):
            self.unsettled = batch
            return None
        acks = [c for c in batch if c.outcome is PROCESSED and not c.follow]
        if len(acks) == len(batch):
            return acks
        applied: list[Completion] = []
        try:
            for completion in batch:
                if completion.outcome is not PROCESSED or completion.follow:
                    try:
                        self._executor.apply(session, completion)
                    except PayloadError as exc:
                        # The backend refused this one record, not the round: the rest settle.
                        self._refused(completion, exc)
                        continue
                    applied.append(completion)
        except Exception as exc:  # noqa: BLE001 - kept and retried; the reservation protects the job
            self._report("settle", exc)
            # Not transactional: retry only what was not performed (a second fail()
            # would store the job twice, a second signal would count it twice).
            performed = {id(c) for c in applied}
            self.unsettled = [c for c in batch if id(c) not in performed]
            self._account(applied)
            return None
        self._account(applied)
        return acks

    def _refused(self, completion: Completion, exc: PayloadError) -> None:
        """The backend refused to store ``completion``'s record, which no retry
        changes (drivers store what they can of a text they cannot hold, escaped):
        reported, and let go, still reserved, to run again once its reservation lapses."""
        self._report("settle", exc)
        job = completion.job
        log.error(
            "job %s (%s) could not be settled (%s); it stays reserved and runs again once its reservation lapses",
            job.id,
            job.name,
            completion.outcome.name.lower(),
        )
        self.let_go([job])

    def _account(self, completions: Sequence[Completion]) -> None:
        """Count settled completions, and stop when a job raised SystemExit or KeyboardInterrupt."""
        if self._count is not None and completions:
            self._count(completions)
        running = self.running
        stats = self._stats
        pace = self.pace
        for completion in completions:
            running.pop(id(completion.job), None)
            outcome = completion.outcome
            if outcome is PROCESSED or outcome is RELEASED or outcome is FAILED:
                # Quick to rise, slow to fall: one slow job shrinks the prefetch at once.
                duration = completion.duration
                if pace is None:
                    pace = duration
                else:
                    pace += (0.5 if duration > pace else 0.05) * (duration - pace)
            if outcome is PROCESSED:
                stats.processed += 1
            elif outcome is RELEASED:
                stats.released += 1
            elif outcome is FAILED:
                stats.failed += 1
            elif outcome is INTERRUPTED:
                stats.interrupted += 1
            elif outcome is DEFERRED:
                stats.deferred += 1
            elif outcome is SKIPPED:
                stats.skipped += 1
            if completion.interrupted and outcome is not INTERRUPTED and not self._stopping():
                log.warning("a job raised %s: stopping the worker", type(completion.exception).__name__)
                self._stop()
        self.pace = pace
