"""Batches: many jobs counted as one piece of work, with callbacks when it is done.

``manager.batch(jobs, name="import 42").then(Done()).catch(Failed()).finally_(CleanUp()).dispatch()``

A batch lives in the lock store: its record (name, callbacks, options) as a
value under ``batch:<id>``, its counts as a tally under the same key (total,
pending, processed, failed, skipped, cancelled). Each job carries its batch's
id (``meta["batch"]``). When a job finishes for good, before it is
acknowledged, the worker counts it in the tally (:func:`settle_many`, a settle
round's jobs at once): a job id counts once, so a job run twice (at-least-once
delivery) is not counted twice. (A database worker whose lock store is its own
database, or a Redis worker whose lock store is on its server, counts it with
the acknowledgement instead, see :mod:`rainier_sync.drivers.database.counting`
and :mod:`rainier_sync.drivers.redis.counting`.) The count that sees nothing
pending queues the callbacks: ``then`` when every job succeeded,
``finally_`` in any case; ``catch`` is queued at a job's final failure. Each
callback carries a once-key (``batch:<id>:then``...), so however many settles
queue it (a crash re-runs a job, and its settle queues again) it runs once
(:mod:`rainier_sync.once`).

A failed job of a batch that is retried goes back to pending (failed -1,
pending +1) before it is queued again (:func:`retry`), so its next outcome
counts once; the callbacks' once-keys still keep each to one run.

Without ``allow_failures()`` a final failure cancels the batch; so does
:meth:`~rainier_sync.QueueManager.cancel_batch`. A job of a cancelled batch is
skipped when it comes to run, before its middleware (workers look the cancel
up at most every :data:`CANCEL_LOOKUP` seconds per batch), and counts as
skipped, as does a job of a batch that a middleware skips.

Everything of a batch expires ``retention`` seconds (7 days by default) after
its last change.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import _clock
from .chain import fresh_copy, hand_over
from .drivers.extensions import CountsRetries
from .errors import ConfigurationError
from .jobs import Job
from .types import QueuedJob, decode, encode

if TYPE_CHECKING:
    from .pending import Dispatcher
    from .state.base import LockStore

__all__ = ["Batch", "PendingBatch", "BatchGuard", "settle", "settle_many", "tallied", "call_back", "records_of"]
__all__ += ["CANCEL_LOOKUP", "RETENTION", "retry"]

log = logging.getLogger("rainier_sync")

#: Seconds a batch is kept after its last change (the default).
RETENTION = 7 * 86400.0
#: Longest a worker goes between looking up whether a batch was cancelled.
CANCEL_LOOKUP = 1.0
_COUNTS = ("total", "pending", "processed", "failed", "skipped", "cancelled")
#: The flag group that indexes the batches kept (for listing them).
BATCHES = "batches"


def batch_key(batch_id: str) -> str:
    return f"batch:{batch_id}"


class Batch:
    """A batch as last read: ``id``, ``name``, ``total``, ``pending``,
    ``processed``, ``failed``, ``skipped``, ``cancelled``, ``finished``.

    In a job, ``context.batch`` is its batch: :meth:`add` adds jobs to it.
    """

    def __init__(self, batch_id: str, record: dict[str, Any], counts: dict[str, int], manager: Any = None) -> None:
        self.id = batch_id
        self.name: str | None = record.get("name")
        self.created_at = float(record.get("created_at", 0.0))
        self.total = counts.get("total", 0)
        self.pending = counts.get("pending", 0)
        self.processed = counts.get("processed", 0)
        self.failed = counts.get("failed", 0)
        self.skipped = counts.get("skipped", 0)
        self.cancelled = bool(counts.get("cancelled", 0))
        self._record = record
        self._manager = manager

    @property
    def finished(self) -> bool:
        """Every job has finished (processed, failed or skipped)."""
        return self.pending <= 0

    @property
    def progress(self) -> float:
        """The share of jobs finished, from 0.0 to 1.0."""
        return 1.0 if self.total <= 0 else (self.total - max(0, self.pending)) / self.total

    def add(self, jobs: Sequence[Job]) -> list[str | None]:
        """Add jobs to this batch (counted before they are queued); their ids."""
        if self._manager is None:
            raise ConfigurationError("this Batch was read without a manager: add jobs through the manager's batch")
        return _queue(self._manager, self.id, self._record, list(jobs))

    def __repr__(self) -> str:
        return (
            f"Batch(id={self.id!r}, name={self.name!r}, total={self.total}, pending={self.pending}, "
            f"processed={self.processed}, failed={self.failed}, cancelled={self.cancelled}, finished={self.finished})"
        )


class PendingBatch:
    """A batch being built: ``manager.batch(jobs, name=...).then(J()).dispatch()``.

    What the builder set reads back as ``name``, ``jobs``, ``callbacks``,
    ``allows_failures``, ``queue``, ``connection`` and ``retention``; ``id`` is
    the batch's id once dispatched (None before). A fake manager records it so,
    for ``assert_batched`` to look at.
    """

    def __init__(self, manager: Any, jobs: Sequence[Job], name: str | None = None) -> None:
        if isinstance(jobs, Job) or not isinstance(jobs, Sequence):
            raise TypeError(f"a batch takes a list of jobs, got {type(jobs).__name__}")
        if not jobs:
            raise ValueError("a batch needs at least one job: got an empty list")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"a batch's name must be a string, got {name!r}")
        self._manager = manager
        self._jobs = list(jobs)
        _check_jobs(manager, self._jobs)
        self._record: dict[str, Any] = {"name": name, "allow_failures": False, "queue": None}
        self._retention = RETENTION
        #: The batch's id once dispatched; None before.
        self.id: str | None = None

    @property
    def name(self) -> str | None:
        """The name given to ``manager.batch(..., name=)``, or None."""
        name: str | None = self._record["name"]
        return name

    @property
    def jobs(self) -> list[Job]:
        """The batch's jobs, in order (a copy)."""
        return list(self._jobs)

    @property
    def callbacks(self) -> dict[str, Job]:
        """The callbacks set, by ``"then"``, ``"catch"`` and ``"finally"`` (a copy)."""
        return {which: self._record[which] for which in ("then", "catch", "finally") if which in self._record}

    @property
    def allows_failures(self) -> bool:
        """Whether :meth:`allow_failures` was called (a failure does not cancel the batch)."""
        return bool(self._record["allow_failures"])

    @property
    def queue(self) -> str | None:
        """The queue :meth:`on_queue` set, or None (each job's ``QUEUE``)."""
        queue: str | None = self._record["queue"]
        return queue

    @property
    def connection(self) -> str | None:
        """The connection the jobs go to: the manager's default."""
        connection: str | None = self._manager.default
        return connection

    @property
    def retention(self) -> float:
        """Seconds the batch is kept after its last change (:meth:`keep_for`; default :data:`RETENTION`)."""
        return self._retention

    def __repr__(self) -> str:
        names = ", ".join(sorted(self.callbacks))
        return (
            f"PendingBatch(name={self.name!r}, jobs={len(self._jobs)}, callbacks=[{names}], "
            f"allows_failures={self.allows_failures}, queue={self.queue!r})"
        )

    def then(self, job: Job) -> PendingBatch:
        """Queue ``job`` once when every job of the batch succeeded."""
        return self._callback("then", job)

    def catch(self, job: Job) -> PendingBatch:
        """Queue ``job`` once, at the first job that fails for good."""
        return self._callback("catch", job)

    def finally_(self, job: Job) -> PendingBatch:
        """Queue ``job`` once when every job has finished, however."""
        return self._callback("finally", job)

    def allow_failures(self) -> PendingBatch:
        """Go on after a failure (by default a failure cancels the batch)."""
        self._record["allow_failures"] = True
        return self

    def on_queue(self, queue: str) -> PendingBatch:
        """Queue the batch's jobs on ``queue``."""
        from .jobs import check_queue_name

        self._record["queue"] = check_queue_name(queue)
        return self

    def keep_for(self, seconds: float) -> PendingBatch:
        """Keep the batch this long after its last change (default: 7 days)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 1e9:
            raise ValueError(f"keep_for takes a positive number of seconds, got {seconds!r}")
        self._retention = float(seconds)
        return self

    def _callback(self, which: str, job: Job) -> PendingBatch:
        _check_jobs(self._manager, [job], f"the batch's {which}")
        self._record[which] = job
        return self

    def dispatch(self) -> Batch:
        """Record the batch, then queue its jobs; returns the batch."""
        manager = self._manager
        locks = _locks(manager)
        batch_id = self.id = os.urandom(16).hex()
        record = dict(self._record)
        record.update(created_at=_clock.now(), retention=self._retention)
        for which in ("then", "catch", "finally"):
            if record.get(which) is not None:
                queued = manager.build(record[which])
                record[which] = [manager.default, queued.to_wire()]
        counts = {**dict.fromkeys(_COUNTS, 0), "total": len(self._jobs), "pending": len(self._jobs)}
        locks.tally_add(batch_key(batch_id), counts, self._retention)
        locks.put_value(batch_key(batch_id), encode(record), self._retention)
        locks.set_flag(BATCHES, batch_id, True)
        _queue(manager, batch_id, record, self._jobs, counted=True)
        return read(manager, batch_id) or Batch(batch_id, record, counts, manager)


def _check_jobs(manager: Any, jobs: list[Any], what: str = "job") -> None:
    records_only = getattr(manager, "records_only", False)
    for index, job in enumerate(jobs):
        label = what if what != "job" else f"job {index} of the batch"
        if not isinstance(job, Job):
            raise TypeError(f"{label} is {job!r}, not a Job")
        if not records_only and manager.registry.find(type(job).NAME) is None:
            raise ConfigurationError(f"{label}: job {type(job).NAME!r} is not registered")


def _locks(manager: Any) -> LockStore:
    locks: LockStore = manager._store("a batch (its counts)")
    return locks


def _queue(
    manager: Any, batch_id: str, record: dict[str, Any], jobs: list[Job], *, counted: bool = False
) -> list[str | None]:
    """Count ``jobs`` into the batch (unless ``counted`` already), then queue them
    as ``dispatch_many`` does (counted first: a job that finishes at once must
    find itself counted)."""
    if not jobs:
        return []
    if not counted:
        _check_jobs(manager, jobs)
        retention = float(record.get("retention", RETENTION))
        _locks(manager).tally_add(batch_key(batch_id), {"total": len(jobs), "pending": len(jobs)}, retention)
    ids: list[str | None] = manager._dispatch_many(jobs, queue=record.get("queue"), meta={"batch": batch_id})
    return ids


def read(manager: Any, batch_id: str) -> Batch | None:
    """The batch ``batch_id`` as stored now, or None."""
    locks = _locks(manager)
    text = locks.get_value(batch_key(batch_id))
    counts = locks.tally(batch_key(batch_id))
    if text is None or counts is None:
        return None
    return Batch(batch_id, decode(text), counts, manager)


def listing(manager: Any, limit: int = 100) -> list[Batch]:
    """The batches still kept, newest first (at most ``limit``); those that expired leave the index."""
    locks = _locks(manager)
    found: list[Batch] = []
    for batch_id in locks.flags(BATCHES):
        batch = read(manager, batch_id)
        if batch is None:
            locks.set_flag(BATCHES, batch_id, False)
        else:
            found.append(batch)
    found.sort(key=lambda b: (-b.created_at, b.id))
    return found[:limit]


def cancel(manager: Any, batch_id: str) -> bool:
    """Cancel the batch: its jobs not yet started are skipped. False when there is no such batch."""
    batch = read(manager, batch_id)
    if batch is None:
        return False
    if not batch.cancelled:
        retention = float(batch._record.get("retention", RETENTION))
        _locks(manager).tally_add(batch_key(batch_id), {"cancelled": 1}, retention)
        BatchGuard.note(batch_id, True)
    return True


#: A batch's record as this process last read it, and when (monotonic): a record
#: never changes once written, so a worker reads it once a minute, not per job.
_records: dict[str, tuple[float, dict[str, Any]]] = {}
_records_mutex = threading.Lock()
RECORD_KEPT = 60.0


def _record(locks: LockStore, batch_id: str) -> dict[str, Any] | None:
    now = _clock.monotonic()
    with _records_mutex:
        held = _records.get(batch_id)
    if held is not None and now - held[0] < RECORD_KEPT:
        return held[1]
    text = locks.get_value(batch_key(batch_id))
    if text is None:
        return None
    record: dict[str, Any] = decode(text)
    with _records_mutex:
        if len(_records) > 1000:
            _records.clear()
        _records[batch_id] = (now, record)
    return record


def settle(
    locks: LockStore | None, dispatcher: Dispatcher | None, queued: QueuedJob, field: str
) -> dict[str, int] | None:
    """Count ``queued`` (a job of a batch) as ``processed``, ``failed`` or
    ``skipped`` and queue what its batch's counts call for; its batch's counts."""
    return settle_many(locks, dispatcher, [(queued, field)]).get(str((queued.meta or {}).get("batch")))


def settle_many(
    locks: LockStore | None, dispatcher: Dispatcher | None, finished: Sequence[tuple[QueuedJob, str]]
) -> dict[str, dict[str, int]]:
    """Count each finished job of a batch (``(job, field)``, field ``processed``,
    ``failed`` or ``skipped``) in one round trip of the store, then queue what each
    batch's counts call for; the counts by batch id. Raises when the store (or a
    callback's queue) fails: calling it again counts nothing twice."""
    if not finished:
        return {}
    if locks is None:
        raise ConfigurationError("this job belongs to a batch, and its worker has no lock store to count it in")
    records: dict[str, dict[str, Any]] = {}
    items: list[tuple[str, str, str, float]] = []
    for queued, field in finished:
        batch_id = str((queued.meta or {}).get("batch"))
        record = records[batch_id] if batch_id in records else _record(locks, batch_id)
        if record is None:
            continue  # the batch expired (or was never recorded): nothing to count
        records[batch_id] = record
        items.append((batch_key(batch_id), queued.id, field, float(record.get("retention", RETENTION))))
    by_key, failed_keys = tallied(items, locks.tally_settle_many(items) if items else [])
    counted = {key[len("batch:") :]: counts for key, counts in by_key.items()}
    failed = {key[len("batch:") :] for key in failed_keys}

    def cancel(batch_id: str, retention: float) -> dict[str, int]:
        return locks.tally_add(batch_key(batch_id), {"cancelled": 1}, retention)

    call_back(dispatcher, records, counted, failed, cancel)
    return counted


def tallied(
    items: Sequence[tuple[str, str, str, float]], settled: Sequence[tuple[dict[str, int], bool]]
) -> tuple[dict[str, dict[str, int]], set[str]]:
    """What ``tally_settle_many(items)`` answered (``settled``): each tally's counts
    by key, and the keys of the tallies that counted a failure."""
    counts: dict[str, dict[str, int]] = {}
    failed: set[str] = set()
    for (key, _, field, _), (tally, _) in zip(items, settled, strict=True):
        counts[key] = tally
        if field == "failed":  # new or not: a crash may have come between its count and its catch
            failed.add(key)
    return counts, failed


def call_back(
    dispatcher: Dispatcher | None,
    records: dict[str, dict[str, Any]],
    counted: dict[str, dict[str, int]],
    failed: set[str],
    cancel: Callable[[str, float], dict[str, int]],
) -> None:
    """Queue what each batch's counts (``counted``, by batch id) call for, the
    batches of ``failed`` having just counted a failure: ``catch`` (and, without
    ``allow_failures``, ``cancel(batch_id, retention)``, its counts after), then
    ``then`` and ``finally`` once nothing is pending. ``counted`` is updated."""
    for batch_id, counts in counted.items():
        record = records[batch_id]
        if batch_id in failed:
            if not record.get("allow_failures") and not counts.get("cancelled"):
                counts = counted[batch_id] = cancel(batch_id, float(record.get("retention", RETENTION)))
                BatchGuard.note(batch_id, True)
            _callback(dispatcher, batch_id, record, "catch")
        if counts.get("pending", 1) <= 0:
            if counts.get("failed", 0) == 0 and counts.get("skipped", 0) == 0:
                _callback(dispatcher, batch_id, record, "then")
            _callback(dispatcher, batch_id, record, "finally")


def records_of(locks: LockStore, jobs: Sequence[QueuedJob]) -> dict[str, dict[str, Any]]:
    """The records of these jobs' batches still kept, by batch id."""
    records: dict[str, dict[str, Any]] = {}
    for queued in jobs:
        batch_id = str((queued.meta or {}).get("batch"))
        if batch_id not in records:
            record = _record(locks, batch_id)
            if record is not None:
                records[batch_id] = record
    return records


def _callback(dispatcher: Dispatcher | None, batch_id: str, record: dict[str, Any], which: str) -> None:
    found = record.get(which)
    if not found:
        return
    connection, wire = found
    job = fresh_copy(wire, connection, 0.0)
    job.meta = {"once": f"batch:{batch_id}:{which}", "hold": float(record.get("retention", RETENTION))}
    hand_over(dispatcher, (connection, job))


class BatchGuard:
    """Whether a batch was cancelled, as this process last looked it up: the
    executor skips a job of a cancelled batch before it runs (counted as skipped)."""

    _seen: dict[str, tuple[float, bool]] = {}
    _mutex = threading.Lock()

    @classmethod
    def note(cls, batch_id: str, cancelled: bool) -> None:
        """What this process just learnt of a batch (it cancelled it)."""
        with cls._mutex:
            cls._seen[batch_id] = (_clock.monotonic(), cancelled)

    @classmethod
    def skip_reason(cls, locks: LockStore | None, batch_id: str) -> str | None:
        """Why a job of ``batch_id`` is skipped (its batch was cancelled), or None;
        looked up in ``locks`` at most every :data:`CANCEL_LOOKUP` seconds."""
        if locks is None:
            return None
        now = _clock.monotonic()
        seen = cls._seen.get(batch_id)  # a dict read is atomic; the writes hold the mutex
        if seen is None or now - seen[0] >= CANCEL_LOOKUP:
            counts = locks.tally(batch_key(batch_id)) or {}
            seen = (now, bool(counts.get("cancelled", 0)))
            with cls._mutex:
                if len(cls._seen) > 10_000:
                    cls._seen.clear()
                cls._seen[batch_id] = seen
        return f"batch {batch_id} was cancelled" if seen[1] else None


def retry(locks: LockStore, driver: Any, queued: QueuedJob, requeue: Callable[[Callable[[str], bool]], bool]) -> bool:
    """Queue ``queued``, a failed job of a batch, again (``requeue(retry_failed)``,
    the manager's retry given the driver's call to make), its failure first taken
    out of its batch's counts (failed -1, pending +1) so that its next outcome
    counts once. Where the driver keeps the batch's tally, one transaction does
    both; elsewhere the store forgets the job's count first
    (:meth:`~rainier_sync.state.Tallies.tally_unsettle`, once per count),
    and puts it back when the job was not queued again and is still failed."""
    batch_id = str((queued.meta or {}).get("batch"))
    record = _record(locks, batch_id)
    if record is None:  # the batch expired (or was never recorded): nothing to count
        return requeue(driver.retry_failed)
    key, retention = batch_key(batch_id), float(record.get("retention", RETENTION))
    if driver.capabilities.counts_retries and CountsRetries.of(driver).counts_batches_of(locks):
        within = CountsRetries.of(driver).retry_failed_counting
        return requeue(lambda job_id: bool(within(job_id, key, retention)))
    _, took = locks.tally_unsettle(key, queued.id, "failed", retention)
    retried = False
    try:
        retried = requeue(driver.retry_failed)
    finally:
        if took and not retried:
            _put_back(locks, driver, queued, key, retention)
    return retried


def _put_back(locks: LockStore, driver: Any, queued: QueuedJob, key: str, retention: float) -> None:
    """Count a job whose retry did not queue it as failed again, if it is still failed
    (gone, it was retried by another call, or forgotten)."""
    try:
        still = driver.failed_job(queued.id) is not None
        if still:
            locks.tally_settle(key, queued.id, "failed", retention)
    except Exception:  # noqa: BLE001 - the retry's own outcome (or error) is what the caller hears
        log.exception("failed job %s: its count in %s could not be put back", queued.id, key)


def loader(manager: Any, batch_id: str) -> Callable[[], Batch | None]:
    """What a job's ``context.batch`` reads its batch with."""
    return lambda: read(manager, batch_id)


class RecordedBatch(PendingBatch):
    """A fake manager's batch: dispatching records it and runs nothing."""

    def dispatch(self) -> Batch:
        self.id = os.urandom(16).hex()
        self._manager.recording.batches.append(self)
        counts = {"total": len(self.jobs), "pending": len(self.jobs)}
        return Batch(self.id, {"name": self.name}, counts)
