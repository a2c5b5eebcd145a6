"""Per-partition bookkeeping: which records a consumer read from each
assigned partition and which are done; the coalesced commits of the offsets
below which every record is done, confirmed by the broker; and the *done*
markers that let a partition's next owner pass finished jobs whose commit was
held back."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ... import _clock
from ...state.base import LockStore
from .client import TP, Consumer, KafkaError, KafkaException, TopicPartition, _code
from .records import _Partition, _Record

log = logging.getLogger("rainier_sync.kafka")

#: The owner of every *done* marker: any consumer can check a marker by renewing it.
_DONE_OWNER = "done"
#: Seconds after which a commit the broker has not answered no longer holds the next one back.
_COMMIT_STALE = 30.0


class PartitionBook:
    """A consumer's assigned partitions, its commits and its done markers."""

    def __init__(self, locks: LockStore, *, lease: float, commit_interval: float) -> None:
        self.locks = locks
        #: Least seconds between two asynchronous commits. Whatever it is, one
        #: commit is outstanding at a time: the next carries the latest offsets.
        self.commit_interval = commit_interval
        #: How long a *done* marker lives. The worker renews the markers of its
        #: finished jobs until their commit is confirmed, so a marker outlives the
        #: job's lease and is there when the partition's next owner reads the record.
        self.done_ttl = max(lease, 60.0)
        self._parts: dict[TP, _Partition] = {}
        self._last_commit = 0.0
        self._commit_sent_at: float | None = None  # the outstanding asynchronous commit
        self._next_renewal = 0.0  # of done markers whose commit is held back
        self._quiet_until: dict[Any, float] = {}

    def _done_key(self, record: _Record) -> str:
        return record.key.replace(":lease:", ":done:", 1)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker answered an asynchronous commit (served by poll/consume)."""
        self._commit_sent_at = None
        refused = []
        for tp in partitions:
            failed = err if err is not None else tp.error
            if failed is not None:
                refused.append(f"{tp.topic}[{tp.partition}]@{tp.offset}")
                continue
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None and tp.offset >= 0:
                part.confirm(tp.offset)
        if refused and (err is None or err.code() != KafkaError._NO_OFFSET):
            now = _clock.monotonic()
            if now >= self._quiet_until.get("commit", 0.0):
                self._quiet_until["commit"] = now + 10.0
                log.warning("kafka: commit of %s refused (sent again): %s", ", ".join(refused[:4]),
                            err if err is not None else partitions[0].error)

    def _mark(self, records: Sequence[_Record]) -> None:
        """Write the *done* markers of finished jobs, in one call: whoever reads
        their records again (after a crash, a broker restart or a rebalance)
        passes them instead of running them again."""
        try:
            self.locks.acquire_many([(self._done_key(r), _DONE_OWNER) for r in records], self.done_ttl)
        except Exception as exc:  # noqa: BLE001 - the commit still covers them; a crash first runs them again
            log.warning("kafka: could not mark %d finished job(s) done in the lock store: %s", len(records), exc)
            return
        now = _clock.now()
        for record in records:
            record.marked = True
            record.marked_at = now

    def _marked(self, records: Sequence[_Record]) -> list[bool]:
        """Which of ``records`` have a done marker (renewing a marker is how to see it in one call)."""
        return self.locks.renew_many([(self._done_key(r), _DONE_OWNER) for r in records], self.done_ttl)

    def _renew_marks(self, now: float) -> None:
        """Renew the done markers of finished jobs whose commit is held back (by an
        older job still running, say), so they outlive any wait for the commit."""
        self._next_renewal = now + self.done_ttl / 3
        stale = [r for part in self._parts.values() for r in part.finished()
                 if r.marked and now - r.marked_at >= self.done_ttl / 3]
        if not stale:
            return
        try:
            renewed = self._marked(stale)
        except Exception as exc:  # noqa: BLE001 - tried again next time
            log.warning("kafka: could not renew the done markers of %d job(s): %s", len(stale), exc)
            return
        for record, ok in zip(stale, renewed, strict=True):
            if ok:
                record.marked_at = now
        lost = [r for r, ok in zip(stale, renewed, strict=True) if not ok]
        if lost:
            self._mark(lost)

    def _live(self, record: _Record) -> bool:
        return self._parts.get(record.part.tp) is record.part

    def _commit(self, consumer: Consumer, *, force: bool = False) -> None:
        """Commit, per partition, the offset below which every record is done.

        Asynchronous and coalesced: while a commit awaits the broker's answer
        (``_on_commit``) none is sent, and the next carries the latest offsets;
        a refused one is not confirmed, so it is sent again. ``force`` commits
        synchronously now."""
        if _clock.now() >= self._next_renewal:
            self._renew_marks(_clock.now())
        now = _clock.monotonic()
        if not force:
            sent = self._commit_sent_at
            if sent is not None and now - sent < _COMMIT_STALE:
                return
            if now - self._last_commit < self.commit_interval:
                return
        commits = []
        for part in self._parts.values():
            point = part.commit_point()
            if point > part.committed:
                commits.append(TopicPartition(part.tp[0], part.tp[1], point))
        if not commits:
            return
        self._last_commit = now
        try:
            if not force:
                consumer.commit(offsets=commits, asynchronous=True)
                self._commit_sent_at = now
                return
            for tp in consumer.commit(offsets=commits, asynchronous=False) or []:
                confirmed = self._parts.get((tp.topic, tp.partition))
                if confirmed is not None and tp.error is None and tp.offset >= 0:
                    confirmed.confirm(tp.offset)
        except KafkaException as exc:
            if _code(exc) != KafkaError._NO_OFFSET:
                log.warning("kafka: commit failed (sent again with the next one): %s", exc)
