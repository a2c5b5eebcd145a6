"""The consumer session: handing jobs out under leases, watching contended
ones, and settling them (acknowledge, give back, release, fail, extend)."""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import replace
from typing import Sequence

from ... import _clock
from ...types import ExceptionInfo, FailedJob, QueuedJob, as_exception_info, encode
from .. import base
from ..base import Capabilities, Waker, as_job_list
from .client import _DELAYED, _FAILED, Consumer
from .consumer import KafkaConsumer
from .records import _DONE, _PARKED, _READY, _RUNNING, _WATCHED, _Receipt, _Record

log = logging.getLogger("rainier_sync.kafka")


class KafkaSession(KafkaConsumer, base.Consumer):
    """The consumer operations of one Kafka driver, over its one group consumer.

    A worker process is one consumer: every loop's calls reach this one object
    through the driver, under one lock.
    """

    capabilities = Capabilities(priority=False, give_back=True, wakes=True)

    # -- handing out -------------------------------------------------------------------------------
    def _acquire(self, records: Sequence[_Record]) -> list[bool]:
        """Take the leases of ``records``, in one round trip where the lock store allows."""
        return self.locks.acquire_many([(r.key, r.owner) for r in records], self.lease)

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        if limit <= 0:
            return []
        with self._lock:
            consumer = self._consumer_for(queues)
            self._fill(consumer)
            now = _clock.now()
            self._housekeeping(consumer, now)
            taken: list[QueuedJob] = []
            try:
                for queue in queues:
                    self._promote(queue, now)
                    ready = self._ready.get(queue)
                    while ready and len(taken) < limit:
                        batch: list[_Record] = []
                        while ready and len(batch) < limit - len(taken):
                            record = ready.popleft()
                            if self._live(record) and record.state == _READY:
                                record.owner = f"{self._token}:{next(self._seq)}"
                                batch.append(record)
                        if not batch:
                            break
                        try:
                            acquired = self._acquire(batch)
                        except Exception:
                            # Still ready: put back in order, or no one would hand them
                            # out and their partition's commit would stop at them.
                            ready.extendleft(reversed(batch))
                            raise
                        got = [r for r, ok in zip(batch, acquired, strict=True) if ok]
                        self._reach_past(got)
                        for record, ok in zip(batch, acquired, strict=True):
                            if not ok:
                                self._contended(record, now)
                        # A job whose attempts its dead workers used up is handed out
                        # too (attempts > max_attempts): the executor fails it as crashed.
                        taken.extend(self._hand_out(record, now) for record in self._not_done(got))
                    if len(taken) >= limit:
                        break
                if self._watched:
                    self._check_watched(now)
            except Exception as exc:
                if not taken:
                    raise
                # Their leases are taken: hand them out rather than strand them.
                log.warning("kafka: reserve stopped part-way; handing out the %d job(s) taken: %s", len(taken), exc)
            self._commit(consumer)
            return taken

    def _not_done(self, records: list[_Record]) -> list[_Record]:
        """Of records whose leases were just taken, those to hand out: a record that
        may have run under an earlier owner of its partition, or under this consumer
        before the partition was taken away and given back (its lease lapsed since),
        is passed when its done marker says it finished."""
        suspects = [r for r in records if r.offset < r.part.suspect_to and not r.handouts]
        if not suspects:
            return records
        try:
            marked = self._marked(suspects)
        except Exception as exc:  # noqa: BLE001 - cannot tell: run them (at least once)
            log.warning("kafka: lock store unavailable while checking done markers: %s", exc)
            return records
        done = {id(r) for r, ok in zip(suspects, marked, strict=True) if ok}
        if not done:
            return records
        for record in records:
            if id(record) in done:
                record.state = _DONE
                record.marked = True
        return [r for r in records if id(r) not in done]

    def _hand_out(self, record: _Record, now: float) -> QueuedJob:
        record.state = _RUNNING
        record.handouts += 1
        record.lease_until = now + self.lease
        job = record.job
        return replace(job, attempts=job.attempts + record.handouts + record.lapsed, connection=self._client.connection,
                       receipt=_Receipt(record, record.handouts))

    def _contended(self, record: _Record, now: float) -> None:
        """Someone holds this job's lease: a live worker runs it (or ran it and is
        finishing, or died running it); watch it until it is marked done or the
        lease lapses."""
        record.state = _WATCHED
        record.next_check = now
        self._watched.append(record)

    def _check_watched(self, now: float) -> None:
        still: list[_Record] = []
        due: list[_Record] = []
        for record in self._watched:
            if not self._live(record) or record.state != _WATCHED:
                continue
            (due if record.next_check <= now else still).append(record)
        if not due:
            self._watched = still
            return
        try:
            marked = self._marked(due)
        except Exception as exc:  # noqa: BLE001 - try again next time
            log.warning("kafka: lock store unavailable while watching %d job(s): %s", len(due), exc)
            for record in due:
                record.next_check = now + 1.0
            self._watched = still + due
            return
        for record, done in zip(due, marked, strict=True):
            if done:
                # Finished by its worker (before a crash, or elsewhere after a rebalance).
                record.state = _DONE
                record.marked = True
                continue
            try:
                holder = self.locks.owner(record.key)
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("kafka: lock store unavailable while watching job %s: %s", record.job.id, exc)
                record.next_check = now + 1.0
                still.append(record)
                continue
            if holder is None:
                # The worker that held it stopped renewing and left no done marker: it
                # died running it (or gave the job up when stopping), which used up an attempt.
                record.lapsed += 1
                record.state = _READY
                self._ready.setdefault(record.queue, collections.deque()).appendleft(record)
            else:
                record.next_check = now + min(1.0, self.lease / 4)
                still.append(record)
        self._watched = still

    def _housekeeping(self, consumer: Consumer, now: float) -> None:
        if self._watched:
            self._check_watched(now)
        cycle: list[_Record] = []
        for parked in self._parked.values():
            for _, record in parked:
                if record.state == _PARKED and record.parked_since + self.park_horizon <= now and self._live(record):
                    cycle.append(record)
        if cycle:
            acked: set[int] = set()
            try:
                self.produce([(r.part.tp[0], r.job.id, r.job.encode().encode()) for r in cycle], acked)
            finally:
                # Only the copies on the broker replace their records: one re-produced
                # again next time would be a second copy, run twice.
                for index in acked:
                    cycle[index].state = _DONE
                if acked:
                    self._forget_stale()

    # -- settling ----------------------------------------------------------------------------------
    def _holding(self, job: QueuedJob) -> _Record | None:
        receipt = job.receipt
        if not isinstance(receipt, _Receipt):
            return None
        record = receipt.record
        if record.handouts != receipt.handout:
            return None  # reclaimed and handed out again: no longer this holder's
        if record.state == _READY and self._live(record):
            # Reclaimed after its lease lapsed but not handed out again: its worker
            # was alive after all, and what it reports (or its heartbeat) still counts.
            record.state = _RUNNING
        return record if record.state == _RUNNING else None

    def _superseded(self, record: _Record) -> bool:
        """True when the job's partition moved away and its lease lapsed: the
        partition's new owner runs it (or will), so this holder must not write
        a copy of it (a retry or a dead letter) beside that run."""
        if self._live(record):
            return False
        try:
            return self.locks.owner(record.key) != record.owner
        except Exception as exc:  # noqa: BLE001 - cannot tell: settle as asked
            log.warning("kafka: lock store unavailable while settling job %s: %s", record.job.id, exc)
            return False

    def _finish(self, records: Sequence[_Record]) -> None:
        """Jobs done (acknowledged, released or failed): mark them, then let the commit pass them."""
        if not records:
            return
        self._mark(records)
        for record in records:
            record.state = _DONE
        if self._consumer is not None:
            self._commit(self._consumer)

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        with self._lock:
            held = [r for r in (self._holding(job) for job in jobs) if r is not None]
            self._finish(held)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs are produced again at once (one batch), their attempt uncounted."""
        with self._lock:
            now = _clock.now()
            back: list[_Record] = []
            copies: list[tuple[str, str, bytes]] = []
            for job in jobs:
                record = self._holding(job)
                if record is None:
                    continue
                if self._superseded(record):
                    record.state = _DONE
                    continue
                again = replace(record.job, attempts=max(0, job.attempts - 1), available_at=now, receipt=None)
                back.append(record)
                copies.append((self._client.topic(job.queue), job.id, again.encode().encode()))
            if copies:
                self.produce(copies)
                self._finish(back)

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self._put_back(job, delay, job.attempts)

    def defer(self, job: QueuedJob, delay: float) -> None:
        """Produced again due in ``delay`` seconds, its attempt uncounted."""
        self._put_back(job, delay, max(0, job.attempts - 1))

    def _put_back(self, job: QueuedJob, delay: float, attempts: int) -> None:
        with self._lock:
            record = self._holding(job)
            if record is None:
                return
            if self._superseded(record):
                record.state = _DONE
                log.warning("kafka: job %s lost its lease before its release; its partition's owner runs it", job.id)
                return
            delay = max(0.0, float(delay))
            again = replace(record.job, attempts=attempts, available_at=_clock.now() + delay, receipt=None)
            topic = self._client.topic(job.queue) + (_DELAYED if delay > 0 else "")
            self.produce([(topic, job.id, again.encode().encode())])
            self._finish([record])

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        info = as_exception_info(error)
        with self._lock:
            failed = FailedJob.of(replace(job, receipt=None), info, _clock.now())
            body = {
                "id": failed.id, "name": failed.name, "queue": failed.queue, "payload": failed.payload,
                "error": failed.error, "exception": info.to_dict(), "failed_at": failed.failed_at,
                "attempts": failed.attempts, "max_attempts": failed.max_attempts,
                "job": replace(job, receipt=None).to_wire(),
            }
            record = self._holding(job)
            if isinstance(job.receipt, _Receipt) and (record is None or self._superseded(record)):
                # Reclaimed and handed out again, or run by its partition's new
                # owner: that attempt decides; a dead letter here would be a second copy.
                if record is not None:
                    record.state = _DONE
                log.warning("kafka: job %s lost its lease before it failed; not dead-lettered", job.id)
                return failed
            # A lone surrogate (in an error message, say) as its JSON escape: it reads back the same.
            value = encode({"failed": body}).encode("utf-8", "backslashreplace")
            self.produce([(self._client.topic(job.queue) + _FAILED, job.id, value)])
            if record is not None:
                self._finish([record])
            return failed

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        ttl = self.lease if seconds is None else float(seconds)
        with self._lock:
            now = _clock.now()
            held = [r for r in (self._holding(job) for job in as_job_list(jobs)) if r is not None]
            renewed = self.locks.renew_many([(r.key, r.owner) for r in held], ttl) if held else []
            lapsed = [r for r, ok in zip(held, renewed, strict=True) if not ok]
            for record, ok in zip(held, renewed, strict=True):
                if ok:
                    record.lease_until = now + ttl
            if lapsed:
                # A late heartbeat from a live worker: take the lease back unless
                # someone else took it, rather than let the job run a second time.
                retaken = self.locks.acquire_many([(r.key, r.owner) for r in lapsed], ttl)
                for record, ok in zip(lapsed, retaken, strict=True):
                    if ok:
                        record.state = _RUNNING
                        record.lease_until = now + ttl
                        log.warning("kafka: job %s's lease had lapsed under its live worker; taken back",
                                    record.job.id)
                    else:
                        log.warning("kafka: job %s lost its lease (it lapsed); another worker may run it",
                                    record.job.id)
            if self._consumer is not None:
                self._pull(self._consumer, 0)  # keeps max.poll.interval.ms satisfied while jobs run
                self._commit(self._consumer)

    def reclaim_expired(self) -> int:
        """Hand out again jobs this consumer holds whose lease lapsed (their
        worker stopped renewing it). Other consumers' jobs come back through
        the group: a dead consumer's partitions are reassigned."""
        reclaimed = 0
        with self._lock:
            now = _clock.now()
            for part in self._parts.values():
                for record in part.records:
                    if record.state != _RUNNING or record.lease_until > now:
                        continue
                    if self.locks.owner(record.key) == record.owner:
                        continue
                    record.state = _READY
                    self._ready.setdefault(record.queue, collections.deque()).appendleft(record)
                    reclaimed += 1
        return reclaimed

    # -- waiting -----------------------------------------------------------------------------------
    def _has_work(self, queues: Sequence[str], now: float) -> bool:
        for queue in queues:
            if self._ready.get(queue):
                return True
            parked = self._parked.get(queue)
            if parked and parked[0][0] <= now:
                return True
        return any(r.next_check <= now for r in self._watched)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        deadline = _clock.monotonic() + timeout
        while not waker.is_set() and not self._closed:
            with self._lock:
                consumer = self._consumer_for(queues)
                now = _clock.now()
                if self._has_work(queues, now):
                    return
                left = deadline - _clock.monotonic()
                if left <= 0:
                    return
                self._commit(consumer)
                got = self._pull(consumer, min(0.05, left))
                idle = self._buffered >= self.buffer and not got
            if idle:
                waker.wait(min(0.05, left))

    # -- the driver --------------------------------------------------------------------------------
    def commit_now(self) -> None:
        """Commit what is done and wait for the broker's answer (before reading the
        group's lag); KafkaUnavailableError when it does not come within ``timeout``."""
        with self._lock:
            if self._consumer is not None and not self._commit(self._consumer, force=True):
                raise self._client.unavailable(f"a commit was not answered within {self.commit_wait:g}s")

    def shut_down(self) -> bool:
        """Commit what is done, free the leases of jobs still running, leave the
        group, within ``timeout`` in all. False when already shut down. Never raises."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            consumer, self._consumer = self._consumer, None
            deadline = _clock.monotonic() + self.timeout
            if consumer is not None:
                try:
                    self._commit(consumer, force=True, wait=self.timeout)
                    # Jobs still running here were abandoned: free their leases for the next owner.
                    running = [r for part in self._parts.values() for r in part.records if r.state == _RUNNING]
                    for record in running:
                        self.locks.release(record.key, record.owner)
                except Exception as exc:  # noqa: BLE001 - closing must not raise; their leases lapse
                    log.warning("kafka: closing the consumer: %s", exc)
                # Always: leave the group (revoking, so what is done is committed
                # and marked) rather than hold its partitions until it is dropped.
                self._close_consumer(consumer, max(1.0, deadline - _clock.monotonic()))
            return True

    def _close_consumer(self, consumer: Consumer, wait: float) -> None:
        """``consumer.close()``, waited for at most ``wait`` seconds: librdkafka's
        close waits without end for the answer to a commit sent to a coordinator
        that stopped answering (a frozen broker, a lost network)."""

        def close() -> None:
            try:
                consumer.close()
            except Exception as exc:  # noqa: BLE001 - closing must not raise
                log.warning("kafka: closing the consumer: %s", exc)

        closing = threading.Thread(target=close, name="rainier-kafka-close", daemon=True)
        closing.start()
        closing.join(wait)
        if closing.is_alive():
            log.warning("kafka: connection %r: the consumer did not leave the group within %.0fs (the broker does "
                        "not answer); left closing in the background, its partitions go to the group's other "
                        "workers after session.timeout.ms", self._client.connection, wait)
