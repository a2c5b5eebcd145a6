"""The fleet: the workers that record themselves in the lock store, and the jobs
they finished per minute.

A worker whose manager has a lock store keeps a JSON record under
``worker:<id>`` (refreshed every :data:`RECORD_EVERY` seconds, lapsing
:data:`RECORD_TTL` seconds after the last refresh) and raises its flag in
``workers:<connection>``, so a listing finds it; a clean exit removes both, and
a listing lowers the flags whose records lapsed. Its finished attempts are
counted in memory and added, with each refresh, to the tally
``throughput:<connection>:<minute>`` (fields ``<queue>|<outcome>``), kept
:data:`THROUGHPUT_KEEP` seconds: one write per refresh, never one per job. The
same tally holds a histogram of the minute's wait times (dispatch, or the due
time of a delayed job, to the start of its first attempt): fields
``<queue>|wait<=<bound>``, one per bucket of :data:`WAIT_BUCKETS` that counted
something, so percentiles of the whole fleet can be read back.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from . import _clock

if TYPE_CHECKING:
    from .execution import Completion, Outcome
    from .state.base import LockStore
    from .types import QueuedJob

__all__ = [
    "WorkerInfo",
    "RunningJob",
    "MinuteCounts",
    "FleetRecorder",
    "list_workers",
    "read_throughput",
    "RECORD_EVERY",
    "RECORD_TTL",
    "THROUGHPUT_KEEP",
    "RUNNING_SHOWN",
    "WAIT_BUCKETS",
    "wait_percentile",
    "merge_buckets",
    "wait_bucket",
]

#: Seconds between a worker's refreshes of its record (and flushes of its counts).
RECORD_EVERY = 5.0
#: Seconds a worker's record outlives its last refresh: a worker that died without
#: removing it leaves every listing this long after.
RECORD_TTL = 30.0
#: Seconds a minute's counts are kept.
THROUGHPUT_KEEP = 2 * 3600.0
#: The most running jobs a record lists (it still counts them all).
RUNNING_SHOWN = 50
#: The outcomes a minute's counts name, in the order pages show them.
OUTCOMES = ("processed", "failed", "released", "deferred", "skipped", "interrupted", "abandoned")
#: Upper bounds (seconds) of the wait-time buckets counted per minute, the last
#: one infinite: from a fleet that keeps up to a backlog of hours.
WAIT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, math.inf,
)  # fmt: skip
_WAIT_PREFIX = "wait<="
_WAIT_FIELDS = tuple(f"{_WAIT_PREFIX}{bound:g}" for bound in WAIT_BUCKETS)


def worker_key(worker_id: str) -> str:
    return f"worker:{worker_id}"


def workers_group(connection: str) -> str:
    return f"workers:{connection}"


def throughput_key(connection: str, minute: int) -> str:
    """The tally of ``connection``'s counts in the minute starting at ``minute`` (seconds since the epoch)."""
    return f"throughput:{connection}:{minute}"


@dataclass(frozen=True)
class RunningJob:
    """A job a worker was running at its last refresh."""

    id: str
    name: str
    queue: str
    #: When the attempt started, in seconds since the epoch.
    started: float


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as it last recorded itself (:meth:`QueueManager.workers`)."""

    id: str
    host: str
    pid: int
    connection: str
    queues: tuple[str, ...]
    concurrency: int
    #: The rainier_sync version the worker runs.
    version: str
    #: When the worker started, and when it last refreshed this record (seconds since the epoch).
    started: float
    last_heartbeat: float
    #: Attempts running at the last refresh: the first :data:`RUNNING_SHOWN`, and how many in all.
    running: tuple[RunningJob, ...] = ()
    running_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "connection": self.connection,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "version": self.version,
            "started": self.started,
            "last_heartbeat": self.last_heartbeat,
            "running": [
                {"id": job.id, "name": job.name, "queue": job.queue, "started": job.started} for job in self.running
            ],
            "running_count": self.running_count,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerInfo:
        return cls(
            id=str(data["id"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            connection=str(data["connection"]),
            queues=tuple(str(q) for q in data["queues"]),
            concurrency=int(data["concurrency"]),
            version=str(data["version"]),
            started=float(data["started"]),
            last_heartbeat=float(data["last_heartbeat"]),
            running=tuple(
                RunningJob(str(j["id"]), str(j["name"]), str(j["queue"]), float(j["started"])) for j in data["running"]
            ),
            running_count=int(data["running_count"]),
        )


@dataclass(frozen=True)
class MinuteCounts:
    """What the fleet finished in one minute (:meth:`QueueManager.throughput`)."""

    #: The minute's start, in seconds since the epoch.
    minute: int
    #: Attempts by queue and outcome (``processed``, ``failed``, ``released``, ``deferred``...).
    by_queue: dict[str, dict[str, int]] = field(default_factory=dict)
    #: First attempts that started, by queue and wait-time bucket (its upper bound
    #: in seconds, :data:`WAIT_BUCKETS`): how many waited that long at most.
    waits: dict[str, dict[float, int]] = field(default_factory=dict)

    def total(self, outcome: str) -> int:
        """Attempts of every queue that came to ``outcome``."""
        return sum(counts.get(outcome, 0) for counts in self.by_queue.values())

    @property
    def processed(self) -> int:
        return self.total("processed")

    @property
    def failed(self) -> int:
        return self.total("failed")

    @property
    def released(self) -> int:
        return self.total("released")

    @property
    def deferred(self) -> int:
        return self.total("deferred")

    def wait_buckets(self, queue: str | None = None) -> dict[float, int]:
        """The wait-time histogram of ``queue`` (every queue when None)."""
        if queue is not None:
            return dict(self.waits.get(queue, {}))
        return merge_buckets(self.waits.values())


def merge_buckets(histograms: Iterable[dict[float, int]]) -> dict[float, int]:
    """Wait-time histograms summed bucket by bucket."""
    total: dict[float, int] = {}
    for histogram in histograms:
        for bound, n in histogram.items():
            total[bound] = total.get(bound, 0) + n
    return total


def wait_percentile(buckets: dict[float, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a wait-time histogram, interpolated
    within its bucket as Prometheus does; None when it counted nothing. In the
    last, unbounded bucket it is that bucket's lower bound (the wait was longer)."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, got {q!r}")
    total = sum(buckets.values())
    if total <= 0:
        return None
    rank = q * total
    seen, previous = 0, 0.0
    for bound in sorted(buckets):
        n = buckets[bound]
        # A histogram holds only the buckets that counted something: the one below is the standard one.
        below = bisect.bisect_left(WAIT_BUCKETS, bound)
        lower = max(previous, WAIT_BUCKETS[below - 1] if below > 0 else 0.0)
        if n > 0 and seen + n >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - seen) / n
        seen += n
        previous = bound
    return previous


def wait_bucket(job: QueuedJob, began: float) -> int:
    """The index in :data:`WAIT_BUCKETS` of how long a first attempt, begun at
    ``began`` (seconds since the epoch), waited since the job fell due (its
    dispatch, or later for a delayed job); -1 for a retry, whose wait is its backoff."""
    if job.attempts != 1:
        return -1
    since = job.available_at if job.available_at > job.dispatched_at else job.dispatched_at
    if since <= 0:
        return -1
    return bisect.bisect_left(WAIT_BUCKETS, began - since)


def _version() -> str:
    try:
        return metadata.version("rainier_sync")
    except metadata.PackageNotFoundError:
        return "unknown"


class _Pending:
    """One minute's counts not yet written: attempts by queue and outcome, and
    first attempts' waits by queue, one count per bucket of :data:`WAIT_BUCKETS`."""

    __slots__ = ("counts", "waits")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, Outcome], int] = {}
        self.waits: dict[str, list[int]] = {}

    def fields(self) -> dict[str, int]:
        """The tally's fields: ``<queue>|<outcome>`` and ``<queue>|wait<=<bound>`` (buckets that counted something)."""
        found = {f"{queue}|{outcome.value}": n for (queue, outcome), n in self.counts.items()}
        for queue, histogram in self.waits.items():
            for index, n in enumerate(histogram):
                if n:
                    found[f"{queue}|{_WAIT_FIELDS[index]}"] = n
        return found

    def add(self, other: _Pending) -> None:
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for queue, histogram in other.waits.items():
            held = self.waits.setdefault(queue, [0] * len(WAIT_BUCKETS))
            for index, n in enumerate(histogram):
                held[index] += n


class FleetRecorder:
    """One worker's record and counts. Its owning loop counts what settles
    (:meth:`count`); the writes happen on a thread of the recorder's own
    (:meth:`start`), so a slow lock store never holds up a claim. Failed writes
    go to ``report`` and are tried again at the next refresh; nothing here raises."""

    def __init__(
        self,
        locks: LockStore,
        connection: str,
        queues: Sequence[str],
        concurrency: int,
        *,
        report: Callable[[str, BaseException], None],
        running: Callable[[], Iterable[tuple[QueuedJob, float]]],
        last_turn: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.locks = locks
        self.connection = connection
        self._report = report
        self._running = running
        self._last_turn = last_turn
        host = socket.gethostname()
        pid = os.getpid()
        self.id = f"{host}-{pid}-{secrets.token_hex(4)}"
        self._record: dict[str, Any] = {
            "id": self.id,
            "host": host,
            "pid": pid,
            "connection": connection,
            "queues": list(queues),
            "concurrency": concurrency,
            "version": _version(),
        }
        #: Counts not yet written, by minute (swapped out whole under ``_lock``).
        self._counts: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._leaving = threading.Event()
        self._thread: threading.Thread | None = None
        #: A record was written (or tried): leave() then removes it.
        self._written = False

    def start(self) -> None:
        """Write the record now and every :data:`RECORD_EVERY` seconds after, on a
        thread of its own, until :meth:`leave`."""
        if self._thread is not None:
            return
        self._leaving.clear()
        self._thread = threading.Thread(target=self._keep, name=f"rainier-fleet-{self.id}", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while True:
            # A worker whose loop has not turned for as long as a record lives is
            # left to lapse from the list, as a dead one is, until it turns again.
            last = self._last_turn()
            if last is None or _clock.monotonic() - last < RECORD_TTL:
                self.refresh()
            if self._leaving.wait(RECORD_EVERY):
                return

    def count(self, completions: Sequence[Completion]) -> None:
        """Count settled attempts under the current minute, and the wait of each
        first attempt that started (written at the next refresh)."""
        with self._lock:
            self._count(completions)

    def _count(self, completions: Sequence[Completion]) -> None:
        minute = int(_clock.now() // 60) * 60
        pending = self._counts.get(minute)
        if pending is None:
            pending = self._counts[minute] = _Pending()
        counts, waits = pending.counts, pending.waits
        last_key: tuple[str, Outcome] | None = None
        last_queue, histogram, run = "", [], 0
        for completion in completions:  # every settled attempt passes here: kept short
            queue = completion.job.queue
            key = (queue, completion.outcome)
            if key == last_key:  # a round's completions mostly share a queue and an outcome
                run += 1
            else:
                if last_key is not None:
                    counts[last_key] = counts.get(last_key, 0) + run
                last_key, run = key, 1
            bucket = completion.wait_bucket
            if bucket >= 0:
                if queue != last_queue:
                    last_queue = queue
                    histogram = waits.get(queue) or waits.setdefault(queue, [0] * len(WAIT_BUCKETS))
                histogram[bucket] += 1
        if last_key is not None:
            counts[last_key] = counts.get(last_key, 0) + run

    def refresh(self) -> None:
        """Write the record and the counts."""
        self._written = True
        try:
            self.locks.put_value(worker_key(self.id), json.dumps(self._snapshot()), RECORD_TTL)
            # Raised every time: a listing lowers it if the record lapsed while this worker was stuck.
            self.locks.set_flag(workers_group(self.connection), self.id, True)
        except Exception as exc:  # noqa: BLE001 - reported; tried again at the next refresh
            self._report("record_worker", exc)
        self.flush()

    def flush(self) -> None:
        """Add the counts kept in memory to the lock store's tallies."""
        with self._lock:
            if not self._counts:
                return
            pending, self._counts = self._counts, {}
        oldest = _clock.now() - THROUGHPUT_KEEP
        for minute in sorted(pending):
            try:
                self.locks.tally_add(throughput_key(self.connection, minute), pending[minute].fields(), THROUGHPUT_KEEP)
            except Exception as exc:  # noqa: BLE001 - reported; kept for the next refresh
                self._report("count_throughput", exc)
                with self._lock:
                    for later in (m for m in pending if m >= minute and m > oldest):
                        self._counts.setdefault(later, _Pending()).add(pending[later])
                return

    def leave(self) -> None:
        """At a clean exit: stop the recorder's thread, write the last counts and remove the record."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._leaving.set()
            # Bounded: a lock store that hangs leaves the record to lapse on its own.
            thread.join(RECORD_TTL)
        if not self._written:
            return  # never recorded (stopped while it waited for its backend): nothing to remove
        self.flush()
        try:
            self.locks.set_flag(workers_group(self.connection), self.id, False)
            # Overwritten rather than left to lapse: a listing that read the flag just before still skips it.
            self.locks.put_value(worker_key(self.id), "", 1.0)
        except Exception as exc:  # noqa: BLE001 - reported; the record lapses on its own
            self._report("record_worker", exc)

    def _snapshot(self) -> dict[str, Any]:
        running = sorted(self._running(), key=lambda item: item[1])
        now = _clock.now()
        record = self._record
        record.setdefault("started", now)  # the first refresh is the run's start
        record = dict(record)
        record["last_heartbeat"] = now
        record["running"] = [
            {"id": job.id, "name": job.name, "queue": job.queue, "started": started}
            for job, started in running[:RUNNING_SHOWN]
        ]
        record["running_count"] = len(running)
        return record


def list_workers(locks: LockStore, connections: Iterable[str]) -> list[WorkerInfo]:
    """The workers recorded for ``connections``, by connection then start; the
    flags of records that lapsed are lowered on the way."""
    found: list[WorkerInfo] = []
    for connection in connections:
        group = workers_group(connection)
        for worker_id in sorted(locks.flags(group)):
            info = _read_worker(locks.get_value(worker_key(worker_id)))
            if info is None:
                locks.set_flag(group, worker_id, False)
            else:
                found.append(info)
    found.sort(key=lambda w: (w.connection, w.started, w.id))
    return found


def _read_worker(text: str | None) -> WorkerInfo | None:
    if not text:
        return None
    try:
        return WorkerInfo.from_dict(json.loads(text))
    except (ValueError, TypeError, KeyError):
        return None


def read_throughput(locks: LockStore, connections: Iterable[str], minutes: int = 60) -> list[MinuteCounts]:
    """The counts of the last ``minutes`` minutes (this one included), oldest
    first, summed over ``connections``; a minute nothing finished in has none."""
    names = list(connections)
    last = int(_clock.now() // 60) * 60
    rows: list[MinuteCounts] = []
    for minute in range(last - 60 * (max(1, minutes) - 1), last + 60, 60):
        by_queue: dict[str, dict[str, int]] = {}
        waits: dict[str, dict[float, int]] = {}
        for connection in names:
            for name, n in (locks.tally(throughput_key(connection, minute)) or {}).items():
                queue, _, outcome = name.rpartition("|")
                if outcome.startswith(_WAIT_PREFIX):
                    try:
                        bound = float(outcome[len(_WAIT_PREFIX) :])
                    except ValueError:
                        continue  # not a bucket this version writes
                    histogram = waits.setdefault(queue, {})
                    histogram[bound] = histogram.get(bound, 0) + n
                    continue
                held = by_queue.setdefault(queue, {})
                held[outcome] = held.get(outcome, 0) + n
        rows.append(MinuteCounts(minute, by_queue, waits))
    return rows
