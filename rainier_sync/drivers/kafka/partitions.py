"""Per-partition bookkeeping: which records a consumer read from each
assigned partition and which are done; the coalesced commits of the offsets
below which every record is done, confirmed by the broker; and the *done*
markers that let a partition's next owner pass finished jobs whose commit was
held back; and each partition's *reach*, the offset below which its records
may have been handed out, which tells a partition's next owner which records
to check for done markers whatever the broker says of its offsets."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ... import _clock
from ...errors import CapabilityError
from ...state.base import LockStore
from .client import TP, Consumer, KafkaError, KafkaException, TopicPartition, _code
from .records import _Partition, _Record

log = logging.getLogger("rainier_sync.kafka")

#: The owner of every *done* marker: any consumer can check a marker by renewing it.
_DONE_OWNER = "done"
#: Seconds after which a commit the broker has not answered no longer holds the next one back.
_COMMIT_STALE = 30.0
#: Offsets a partition's stored reach is set ahead of the record being handed out
#: (one lock-store write per this many records handed out, per partition).
_REACH_AHEAD = 1000


class PartitionBook:
    """A consumer's assigned partitions, its commits and its done markers."""

    def __init__(self, locks: LockStore, *, keys: str, lease: float, commit_interval: float) -> None:
        self.locks = locks
        self._keys = keys  # what every lock-store key of this group and prefix begins with
        #: Least seconds between two asynchronous commits. Whatever it is, one
        #: commit is outstanding at a time: the next carries the latest offsets.
        self.commit_interval = commit_interval
        #: How long a *done* marker lives. The worker renews the markers of its
        #: finished jobs until their commit is confirmed, so a marker outlives the
        #: job's lease and is there when the partition's next owner reads the record.
        self.done_ttl = max(lease, 60.0)
        #: How long a partition's stored reach lives (rewritten as records are handed
        #: out, and while done markers below it are renewed).
        self.reach_ttl = max(86_400.0, 3 * self.done_ttl)
        self._reach_kept = True  # False once the lock store said it keeps no values
        self._parts: dict[TP, _Partition] = {}
        self._last_commit = 0.0
        self._commit_sent_at: float | None = None  # the outstanding asynchronous commit
        #: Longest wait for the broker to answer a commit made now (``force``).
        self.commit_wait = 30.0
        self._commits_sent = 0
        self._commits_answered = 0  # commits answer in the order they were sent
        self._next_renewal = 0.0  # of done markers whose commit is held back
        self._quiet_until: dict[Any, float] = {}

    def _done_key(self, record: _Record) -> str:
        return record.key.replace(":lease:", ":done:", 1)

    # -- reach: how far a partition's records were handed out, by any owner ------------------------
    def _reach_key(self, tp: TP) -> str:
        return f"{self._keys}:reach:{tp[0]}:{tp[1]}"

    def _read_reach(self, part: _Partition) -> int | None:
        """The partition's stored reach (0: none stored), or None when the lock store cannot tell."""
        if not self._reach_kept:
            return None
        try:
            value = self.locks.get_value(self._reach_key(part.tp))
        except CapabilityError:
            self._reach_kept = False
            log.warning("kafka: the lock store keeps no values; every record of a newly assigned partition "
                        "is checked for a done marker")
            return None
        except Exception as exc:  # noqa: BLE001 - cannot tell: every record is checked
            log.warning("kafka: lock store unavailable while reading how far %s[%d] was read: %s",
                        part.tp[0], part.tp[1], exc)
            return None
        try:
            return max(0, int(value)) if value is not None else 0
        except ValueError:
            log.warning("kafka: unreadable reach %r of %s[%d]; every record is checked", value, *part.tp)
            return None

    def _learn_reach(self, part: _Partition) -> None:
        """At assignment: records below the reach earlier owners stored may have run."""
        reach = self._read_reach(part)
        part.reach = reach
        if reach is None:
            part.suspect_to = 1 << 62
        else:
            part.suspect_to = max(part.suspect_to, reach)

    def _write_reach(self, part: _Partition, reach: int) -> None:
        self.locks.put_value(self._reach_key(part.tp), str(reach), self.reach_ttl)
        part.reach = reach

    def _reach_past(self, records: Sequence[_Record]) -> None:
        """Before ``records`` are handed out: store their partitions' reach past them
        (ahead, so once per :data:`_REACH_AHEAD` records), so the next owner of a
        partition checks their done markers, even when the broker's committed offset
        and end offset say nothing of them (lost or wrong after a broker crash)."""
        if not self._reach_kept:
            return
        last: dict[TP, tuple[_Partition, int]] = {}
        for record in records:
            part = record.part
            if part.reach is not None and record.offset < part.reach:
                continue
            seen = last.get(part.tp)
            if seen is None or record.offset > seen[1]:
                last[part.tp] = (part, record.offset)
        for part, offset in last.values():
            try:
                known = part.reach if part.reach is not None else self._read_reach(part)
                if known is None:
                    continue  # never lower what another owner stored
                self._write_reach(part, max(known, offset + 1 + _REACH_AHEAD))
            except CapabilityError:
                self._reach_kept = False
                return
            except Exception as exc:  # noqa: BLE001 - the job still runs: at least once
                log.warning("kafka: could not store how far %s[%d] was read: %s", part.tp[0], part.tp[1], exc)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker answered an asynchronous commit (served by poll/consume)."""
        self._commit_sent_at = None
        self._commits_answered += 1
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
        # The reach below those markers lives as long as they do.
        for part in {id(r.part): r.part for r in stale}.values():
            if part.reach is not None and self._reach_kept and self._live_part(part):
                try:
                    self._write_reach(part, part.reach)
                except Exception as exc:  # noqa: BLE001 - tried again next time
                    log.warning("kafka: could not renew how far %s[%d] was read: %s", part.tp[0], part.tp[1], exc)

    def _live(self, record: _Record) -> bool:
        return self._parts.get(record.part.tp) is record.part

    def _live_part(self, part: _Partition) -> bool:
        return self._parts.get(part.tp) is part

    def _serve(self, consumer: Consumer, wait: float) -> None:
        """Serve the consumer's callbacks (``_on_commit``) for up to ``wait`` seconds."""
        consumer.poll(wait)

    def _commit(self, consumer: Consumer, *, force: bool = False, wait: float | None = None) -> bool:
        """Commit, per partition, the offset below which every record is done.

        Asynchronous and coalesced: while a commit awaits the broker's answer
        (``_on_commit``) none is sent, and the next carries the latest offsets;
        a refused one is not confirmed, so it is sent again. ``force`` commits
        now and waits for the broker's answer, at most ``wait`` seconds (default
        ``commit_wait``; librdkafka's synchronous commit waits without end for a
        coordinator that does not answer); False when it did not come."""
        if _clock.now() >= self._next_renewal:
            self._renew_marks(_clock.now())
        now = _clock.monotonic()
        if not force:
            sent = self._commit_sent_at
            if sent is not None and now - sent < _COMMIT_STALE:
                return True
            if now - self._last_commit < self.commit_interval:
                return True
        commits = []
        for part in self._parts.values():
            point = part.commit_point()
            if point > part.committed:
                commits.append(TopicPartition(part.tp[0], part.tp[1], point))
        if not commits:
            return True
        self._last_commit = now
        try:
            consumer.commit(offsets=commits, asynchronous=True)
        except KafkaException as exc:
            if _code(exc) != KafkaError._NO_OFFSET:
                log.warning("kafka: commit failed (sent again with the next one): %s", exc)
            return True
        self._commits_sent += 1
        self._commit_sent_at = now
        if not force:
            return True
        mine = self._commits_sent
        limit = self.commit_wait if wait is None else wait
        deadline = now + limit
        while self._commits_answered < mine:
            left = deadline - _clock.monotonic()
            if left <= 0:
                log.warning("kafka: the broker did not answer a commit within %gs (sent again with the next one)",
                            limit)
                return False
            self._serve(consumer, min(0.05, left))
        return True
