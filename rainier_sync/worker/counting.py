"""Counting a round's finished jobs of batches, for the owning loop (:mod:`.settle`).

Two ways, chosen once per worker:

- in the lock store, in one round trip before the round is applied
  (:func:`rainier_sync.batch.settle_many`): a job id counts once, so a job run
  again after a crash between its count and its acknowledgement is not counted
  again;
- with the acknowledgements themselves, where the driver keeps the lock store's
  tallies in its own backend (it declares ``CountsBatches``, and ``counts_batches_of``
  says so for the store): the database driver with
  its own lock store counts a job in the transaction that removes its row, so
  its count and its acknowledgement happen together or not at all; the Redis
  driver with a lock store on its server counts it in the script that
  acknowledges it, before the acknowledgement (a job id counts once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..batch import RETENTION, batch_key, call_back, records_of, settle_many
from ..drivers.extensions import CountsBatches
from ..execution import FAILED, Completion, Executor
from ..types import QueuedJob

if TYPE_CHECKING:
    from ..drivers.base import ConsumerSession

__all__ = ["Counting"]


class Counting:
    """How one worker counts the jobs of batches it settles."""

    def __init__(self, executor: Executor, report: Callable[[str, BaseException], None]) -> None:
        self._executor = executor
        self._report = report
        self._with_acks: bool | None = None

    def with_acks(self, session: ConsumerSession) -> bool:
        """Whether this worker's driver counts them with its acknowledgements (asked once)."""
        if self._with_acks is None:
            locks = self._executor.locks
            declared = locks is not None and session.capabilities.counts_batches
            self._with_acks = declared and bool(CountsBatches.of(session).counts_batches_of(locks))
        return self._with_acks

    def in_store(self, completions: Sequence[Completion]) -> bool:
        """Count every finished job of a batch among ``completions`` in the lock store,
        at once; False (nothing marked counted) when the store failed."""
        due = [c for c in completions if c.batch is not None]
        if not due:
            return True
        executor = self._executor
        try:
            settle_many(executor.locks, executor.dispatcher, [(c.job, c.batch or "") for c in due])
        except Exception as exc:  # noqa: BLE001 - kept and counted again: a job id counts once
            self._report("batch", exc)
            return False
        for completion in due:
            completion.batch = None
        return True

    def _items(self, completions: Sequence[Completion]) -> tuple[list[Any], dict[str, dict[str, Any]]]:
        """The count items (job, tally key, field, ttl) of those whose batch is still
        kept, and the batches' records; the others are marked counted (nothing to count)."""
        locks = self._executor.locks
        assert locks is not None
        records = records_of(locks, [c.job for c in completions])
        items: list[Any] = []
        # What each kept batch's items share, found once: its tally key and retention.
        shared = {
            batch_id: (batch_key(batch_id), float(record.get("retention", RETENTION)))
            for batch_id, record in records.items()
        }
        for completion in completions:
            found = shared.get(str((completion.job.meta or {}).get("batch")))
            if found is None:
                completion.batch = None
                continue
            items.append((completion.job, found[0], completion.batch, found[1]))
        return items, records

    def settle(self, session: ConsumerSession, completions: Sequence[Completion]) -> list[Completion] | None:
        """Apply (acknowledge, or fail) and count ``completions`` in one transaction of
        the driver, queueing the callbacks the counts call for before it commits. The
        completions it applied (those of batches no longer kept are left to apply the
        usual way); None when the backend failed (nothing applied)."""
        items, records = self._items(completions)
        if not items:
            return []
        by_job = {id(c.job): c for c in completions}
        settled = []
        for item in items:
            completion = by_job[id(item[0])]
            settled.append((item, completion.info if completion.outcome is FAILED else None))
        dispatcher = self._executor.dispatcher

        def after(counts: dict[str, dict[str, int]], failed: set[str], cancel: Callable[[str], dict[str, int]]) -> None:
            counted = {key[len("batch:") :]: found for key, found in counts.items()}
            call_back(
                dispatcher,
                records,
                counted,
                {key[len("batch:") :] for key in failed},
                lambda batch_id, retention: cancel(batch_key(batch_id)),
            )

        try:
            CountsBatches.of(session).settle_counting(settled, after)
        except Exception as exc:  # noqa: BLE001 - kept and settled again: nothing happened
            self._report("settle", exc)
            return None
        applied = [by_job[id(item[0])] for item in items]
        for completion in applied:
            completion.batch = None
        return applied

    def acknowledge(
        self, session: ConsumerSession, acks: list[Completion], queues: Sequence[str], limit: int
    ) -> tuple[list[QueuedJob], list[Completion], list[Completion]]:
        """Acknowledge ``acks`` (and claim up to ``limit`` jobs), counting the jobs of
        batches among them with the acknowledgement. Returns the jobs claimed, the
        completions acknowledged, and those left to settle again (their batch's
        transaction failed). Raises when the acknowledgement itself failed."""
        due = [c for c in acks if c.batch is not None]
        items, _ = self._items(due) if due else ([], {})
        jobs = [c.job for c in acks]
        if not items:
            taken = session.acknowledge_and_reserve(jobs, queues, limit) if limit > 0 else []
            if limit <= 0:
                session.acknowledge_many(jobs)
            for completion in due:
                completion.batch = None
            return taken, acks, []
        taken, held = CountsBatches.of(session).acknowledge_counting(jobs, items, queues, limit)
        by_job = {id(c.job): c for c in acks}
        left = [by_job[id(job)] for job in held]
        kept = {id(c) for c in left}
        for completion in acks:
            if id(completion) not in kept:
                completion.batch = None
        if not left:
            return taken, acks, []
        applied = self.settle(session, left)
        if applied is None:
            return taken, [c for c in acks if id(c) not in kept], left
        if limit > len(taken) and queues:  # what the careful way queued (a batch's callbacks) is due now
            try:
                taken.extend(session.reserve_many(queues, limit - len(taken)))
            except Exception as exc:  # noqa: BLE001 - claimed on the next turn
                self._report("reserve", exc)
        gone = {id(c) for c in applied}
        rest = [c.job for c in left if id(c) not in gone]  # their batch expired meanwhile: nothing to count
        if rest:
            try:
                session.acknowledge_many(rest)
            except Exception as exc:  # noqa: BLE001 - settled again next time
                self._report("settle", exc)
                return taken, [c for c in acks if id(c) not in kept or id(c) in gone], [
                    c for c in left if id(c) not in gone
                ]
        return taken, acks, []
