"""Counting the jobs of batches with their acknowledgements, on Redis.

When the lock store that keeps the batches' tallies is a ``RedisLockStore`` on
the queue's own server and database (not a cluster: a tally and a stream are in
different slots there), a worker's round of acknowledgements counts its jobs of
batches in the same script (lua/count_ack.lua), sent deferred with the next
reserve as an acknowledgement is: no round trip of its own. The script counts
before it acknowledges, and the tally's members keep a job counted once, so a
job run again after its count and before its acknowledgement is not counted
again. A job whose batch the round could finish is left held for
:meth:`_Counting.settle_counting`, which counts it in the store, has the
batch's callbacks queued, and only then acknowledges it, as the worker does
without this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...types import ExceptionInfo, QueuedJob
from ..extensions import CountsBatches
from .core import _Call
from .reading import _IdleReading, _LoopState
from .store import RedisLockStore, _ttl_ms
from .wire import _CHUNK, _GROUP, _Receipt

log = logging.getLogger("rainier_sync")

#: ``(job, tally key, field, ttl)``, as the worker hands them over.
CountItem = tuple[QueuedJob, str, str, float]

__all__ = ["CountItem"]


class _Counting(_IdleReading):
    """The Redis driver's ``CountsBatches`` (``counts_batches_of`` and its two calls)."""

    #: The lock store this driver said it counts for (``counts_batches_of``), None before.
    _tallies: RedisLockStore | None = None

    def counts_batches_of(self, store: Any) -> bool:
        """Whether ``store`` is a ``RedisLockStore`` on this queue's server and database.
        The first such store is the one this driver counts in: another of other keys
        (a second manager on this driver) is not (its batches are counted its own way)."""
        if not isinstance(store, RedisLockStore):
            return False
        ours, theirs = self._topology.place(), store._topology.place()
        if ours is None or ours != theirs:
            return False
        kept = self._tallies
        if kept is not None and kept is not store and kept._prefix != store._prefix:
            return False
        self._tallies = store
        return True

    def _counted_in(self) -> RedisLockStore:
        if self._tallies is None:
            CountsBatches.refuse(self, "settle_counting")
        return self._tallies

    def acknowledge_counting(
        self, done: Sequence[QueuedJob], counts: Sequence[CountItem], queues: Sequence[str], limit: int
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        return self._acknowledge_counting(self._loop_state(), done, counts, queues, limit)

    def _acknowledge_counting(
        self,
        state: _LoopState,
        done: Sequence[QueuedJob],
        counts: Sequence[CountItem],
        queues: Sequence[str],
        limit: int,
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """Acknowledge ``done`` counting ``counts``, in one script sent with the next
        reserve (up to ``limit`` jobs of ``queues``); the jobs claimed, and those of
        ``counts`` left held (their batch could finish, or the count failed)."""
        store = self._counted_in()
        ours: dict[int, CountItem] = {}
        held: list[QueuedJob] = []
        for item in counts:
            # A failure's count queues its batch's catch (and may cancel it): the careful way's.
            if item[2] == "failed":
                held.append(item[0])
            else:
                ours[id(item[0])] = item
        # Per stream (numbered from 1, in order), the entries acknowledged whatever the counts.
        streams: dict[tuple[str, bytes], tuple[int, list[bytes], list[str]]] = {}
        per_tally: dict[str, list[tuple[CountItem, int, bytes]]] = {}
        skip = {id(job) for job in held}
        for job in done:
            receipt = job.receipt
            mine = ours.pop(id(job)) if id(job) in ours else None
            if id(job) in skip:
                continue
            if not isinstance(receipt, _Receipt):
                if mine is not None:
                    held.append(job)
                continue
            where = streams.get((receipt.queue, receipt.band))
            if where is None:
                where = streams[(receipt.queue, receipt.band)] = (len(streams) + 1, [], [])
            if mine is None:
                where[1].append(receipt.entry)
                where[2].append(job.id)
            else:
                per_tally.setdefault(mine[1], []).append((mine, where[0], receipt.entry))
        held += [item[0] for item in ours.values()]  # not among those acknowledged: not ours to count
        if not per_tally or len(done) > _CHUNK or any(len(found) > _CHUNK for found in per_tally.values()):
            members = {id(item[0]) for item in counts}
            rest = [job for job in done if id(job) not in members]
            return self.acknowledge_and_reserve(rest, queues, limit), [item[0] for item in counts]
        reply: list[Any] = []
        self._send_deferred([self._count_call(store, per_tally, streams, reply)])
        taken = self._reserve(state, queues, limit) if limit > 0 and queues else []
        if not reply:  # no round trip yet (what a blocking read took), or the script failed
            try:
                self._sync()
            except Exception:  # noqa: BLE001 - what is claimed is ours: hand it out, the rest goes the careful way
                log.warning("acknowledging with counts failed; counting %d job(s) again", len(counts), exc_info=True)
        if not reply or not isinstance(reply[0], list):
            return taken, [item[0] for item in counts]
        if reply[0]:
            found = list(per_tally.values())
            held += [item[0] for number in reply[0] for item, _, _ in found[int(number) - 1]]
        return taken, held

    def _count_call(
        self,
        store: RedisLockStore,
        per_tally: dict[str, list[tuple[CountItem, int, bytes]]],
        streams: dict[tuple[str, bytes], tuple[int, list[bytes], list[str]]],
        reply: list[Any],
    ) -> _Call:
        """The count_ack call: each tally's ``(item, stream number, entry)``, then per
        stream the entries of the round's other jobs and their job ids."""
        names: list[str] = []
        args: list[Any] = [_GROUP, len(per_tally), len(streams), *(band for _, band in streams)]
        for key, found in per_tally.items():
            names += store._tally_keys(key)
            args += (_ttl_ms(max(item[3] for item, _, _ in found), key), len(found))
            for (job, _, field, _), number, entry in found:
                args += (job.id, field, number, entry)
        keys = self.keys
        for (queue, band), (_, others, ids) in streams.items():
            names += (keys.stream(queue, band), keys.reserved(queue))
            args.append(len(others))
            args += others
            args += ids
        return _Call("count_ack", names, args, reply)

    def settle_counting(
        self,
        settled: Sequence[tuple[CountItem, ExceptionInfo | None]],
        after: Callable[[dict[str, dict[str, int]], set[str], Callable[[str], dict[str, int]]], None],
    ) -> None:
        """Count each job in the store (once per job id), call ``after`` with the
        counts, then acknowledge each ``(item, None)`` job and fail each
        ``(item, error)`` one: a crash before the end runs them again, counted once."""
        from ...batch import tallied

        store = self._counted_in()
        items = [(key, job.id, field, ttl) for (job, key, field, ttl), _ in settled]
        counts, failed = tallied(items, store.tally_settle_many(items))
        ttls: dict[str, float] = {}
        for key, _, _, ttl in items:
            ttls[key] = max(ttls.get(key, 0.0), float(ttl))

        def cancel(key: str) -> dict[str, int]:
            counts[key] = store.tally_add(key, {"cancelled": 1}, ttls[key])
            return counts[key]

        after(counts, failed, cancel)
        for (job, _, _, _), info in settled:
            if info is not None:
                self.fail(job, info)  # a second fail of a job no longer held stores nothing
        self.acknowledge_many([item[0] for item, info in settled if info is None])
