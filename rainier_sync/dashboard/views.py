"""What the dashboard's pages show, computed from the manager: connections
with their queues and failed jobs, a failed job's failure, the schedule, the
charts, the fleet and a batch's failed jobs. No web framework here: the page
builders render these."""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..fleet import merge_buckets, wait_percentile
from ..types import ExceptionInfo, FailedJob, QueueCounts
from .charts import Chart, WaitChart, build_fleet_chart, build_wait_chart

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..fleet import WorkerInfo
    from ..manager import QueueManager

#: How many failed jobs are scanned to count them per queue.
FAILED_SCAN = 1000
#: How many failed jobs a page lists per connection.
FAILED_LIST = 50
#: How many characters of an error a list page shows (and of each cause on a failed job's page).
ERROR_PREVIEW = 300
#: How many bytes (UTF-8) of an error, and of a traceback, a failed job's page shows;
#: the rest is a link away, as plain text.
ERROR_CUT = 64 * 1024
#: How many minutes of the fleet's throughput the charts show.
FLEET_MINUTES = 60


def queue_names(manager: QueueManager, driver: BaseQueue) -> list[str]:
    """The queues worth showing for a connection: those the backend reports,
    those registered jobs go to, and ``default``."""
    names = {"default"}
    names.update(driver.queue_names())
    names.update(job_class.QUEUE for job_class in manager.registry.classes())
    return sorted(names)


@dataclass
class QueueRow:
    queue: str
    counts: QueueCounts
    failed: int
    paused: bool = False


@dataclass
class ConnectionView:
    name: str
    driver: str
    is_default: bool
    queues: list[QueueRow] = field(default_factory=list)
    #: Whether queues can be paused (the manager has a lock store and the driver has workers).
    can_pause: bool = False
    failed_total: int = 0
    failed_jobs: list[FailedJob] = field(default_factory=list)
    error: str | None = None

    @property
    def queued_total(self) -> int:
        return sum(row.counts.total for row in self.queues)


def _connection_view(manager: QueueManager, name: str, driver: BaseQueue, limit: int) -> ConnectionView:
    view = ConnectionView(name=name, driver=driver.kind, is_default=name == manager.default)
    try:
        scanned = driver.failed_jobs(limit=FAILED_SCAN)
        failed_by_queue: dict[str, int] = {}
        for job in scanned:
            failed_by_queue[job.queue] = failed_by_queue.get(job.queue, 0) + 1
        view.can_pause = manager.locks is not None and driver.promises.needs_a_worker
        paused = manager.paused(name) if view.can_pause else set()
        names = set(queue_names(manager, driver)) | set(failed_by_queue) | paused
        for queue in sorted(names):
            view.queues.append(
                QueueRow(queue, driver.counts(queue), failed_by_queue.get(queue, 0), paused=queue in paused)
            )
        view.failed_total = driver.failed_count()
        view.failed_jobs = scanned[:limit]
    except Exception as exc:  # noqa: BLE001 - one unreachable backend must not take the page down
        view.error = f"{type(exc).__name__}: {exc}"
    return view


@dataclass
class ScheduleRow:
    name: str
    #: :meth:`Entry.describe() <rainier_sync.schedule.Entry.describe>`: ``every 30s``, ``cron '*/5 * * * *' (UTC)``.
    when: str
    #: The next tick (seconds since the epoch); None when the cron expression has no more.
    next_run: float | None
    #: The latest tick and the job that holds its key, if one does.
    last_tick: float | None = None
    last_job: str | None = None


@dataclass
class ScheduleView:
    rows: list[ScheduleRow] = field(default_factory=list)
    #: Whether the last dispatched ticks can be read (the manager has a lock store).
    tracked: bool = False
    error: str | None = None


def _schedule_view(manager: QueueManager) -> ScheduleView | None:
    """The schedule's entries, their next run and, with a lock store, the tick last dispatched."""
    from .. import _clock
    from ..scheduler import Scheduler

    schedule = manager.schedule
    if schedule is None or not len(schedule):
        return None
    now = _clock.now()
    view = ScheduleView(tracked=manager.locks is not None)
    entries = list(schedule)
    for entry in entries:
        latest = entry.latest(now)
        following = entry.following(now if latest is None else latest)
        view.rows.append(ScheduleRow(entry.name, entry.describe(), following if math.isfinite(following) else None))
    if view.tracked:
        try:
            scheduler = Scheduler(manager)
            for row, entry in zip(view.rows, entries, strict=True):
                held = scheduler.holder(entry, now)
                if held is not None:
                    row.last_tick, row.last_job = held
        except Exception as exc:  # noqa: BLE001 - an unreachable lock store must not take the page down
            view.error = f"{type(exc).__name__}: {exc}"
    return view


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _clip(text: str, limit: int = ERROR_PREVIEW) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cut_text(text: str, limit: int = ERROR_CUT) -> tuple[str, bool]:
    """The start of ``text`` that fits in ``limit`` bytes of UTF-8, ended after
    its last line break when one falls in the second half; and whether it was cut."""
    head = text[:limit]  # never more characters than bytes
    raw = head.encode("utf-8")
    if len(head) == len(text) and len(raw) <= limit:
        return text, False
    shown = raw[:limit].decode("utf-8", "ignore")
    end = shown.rfind("\n")
    if end >= len(shown) // 2:
        shown = shown[: end + 1]
    return shown, True


@dataclass
class FailureView:
    """What a failed job's page shows of its failure: each part at most
    :data:`ERROR_CUT` bytes, and the error once (the traceback closes with it)."""

    error: str
    error_cut: bool
    #: The cause chain, each message at most :data:`ERROR_PREVIEW` characters.
    causes: list[tuple[str, str]]
    #: The traceback, less the error that closes it when it does; ``error_elided``
    #: when that was left out and nothing before it was cut.
    frames: str
    error_elided: bool
    traceback_cut: bool
    #: How long the error and the traceback are, in characters.
    error_length: int
    traceback_length: int


def _failure_view(info: ExceptionInfo) -> FailureView:
    error = info.error
    shown, error_cut = cut_text(error)
    tb = info.traceback
    # A traceback ends with the error (and a line break): shown once, above it.
    end = len(tb) - 1 if tb.endswith("\n") else len(tb)
    start = end - len(error)
    elided = bool(error) and start >= 0 and tb.endswith(error, start, end) and (start == 0 or tb[start - 1] == "\n")
    frames, traceback_cut = cut_text(tb[:start] if elided else tb)
    return FailureView(
        error=shown,
        error_cut=error_cut,
        causes=[(kind, _clip(message)) for kind, message in info.causes],
        frames=frames,
        error_elided=elided and not traceback_cut,
        traceback_cut=traceback_cut,
        error_length=len(error),
        traceback_length=len(tb),
    )


def _payload_text(payload: Any, *, indent: int | None = None, limit: int | None = None) -> str:
    text = json.dumps(payload, indent=indent, ensure_ascii=False, sort_keys=True, default=repr)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


@dataclass(frozen=True)
class Waits:
    """Wait times (dispatch to start of a first attempt) over some minutes."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None

    @classmethod
    def of(cls, buckets: dict[float, int]) -> Waits:
        return cls(sum(buckets.values()), wait_percentile(buckets, 0.5), wait_percentile(buckets, 0.95))


@dataclass
class FleetView:
    """The Workers page: the workers recorded in the lock store, and the fleet's throughput."""

    #: Whether the manager has a lock store (workers record themselves only in one).
    tracked: bool
    workers: list[WorkerInfo] = field(default_factory=list)
    chart: Chart | None = None
    wait_chart: WaitChart | None = None
    #: The last :data:`FLEET_MINUTES` minutes by queue: ``(queue, {outcome: count}, waits)``.
    queues: list[tuple[str, dict[str, int], Waits]] = field(default_factory=list)
    #: The whole fleet's waits over those minutes.
    waits: Waits = Waits()
    error: str | None = None


@dataclass
class ThroughputView:
    """The index page's chart: the fleet's, as on the Workers page."""

    #: Whether the manager has a lock store (workers count what they finish only in one).
    tracked: bool
    chart: Chart | None = None
    error: str | None = None


def _throughput_view(manager: QueueManager) -> ThroughputView:
    view = ThroughputView(tracked=manager.locks is not None)
    if not view.tracked:
        return view
    try:
        minutes = manager.throughput(minutes=FLEET_MINUTES)
    except Exception as exc:  # noqa: BLE001 - an unreachable lock store must not take the page down
        view.error = f"{type(exc).__name__}: {exc}"
        return view
    view.chart = build_fleet_chart(minutes)
    return view


def _fleet_view(manager: QueueManager) -> FleetView:
    view = FleetView(tracked=manager.locks is not None)
    if not view.tracked:
        return view
    try:
        view.workers = manager.workers()
        minutes = manager.throughput(minutes=FLEET_MINUTES)
    except Exception as exc:  # noqa: BLE001 - an unreachable lock store must not take the page down
        view.error = f"{type(exc).__name__}: {exc}"
        return view
    view.chart = build_fleet_chart(minutes)
    view.wait_chart = build_wait_chart(minutes)
    by_queue: dict[str, dict[str, int]] = {}
    waits: dict[str, list[dict[float, int]]] = {}
    for row in minutes:
        for queue, counts in row.by_queue.items():
            held = by_queue.setdefault(queue, {})
            for outcome, n in counts.items():
                held[outcome] = held.get(outcome, 0) + n
        for queue, buckets in row.waits.items():
            waits.setdefault(queue, []).append(buckets)
            by_queue.setdefault(queue, {})
    view.queues = [
        (queue, counts, Waits.of(merge_buckets(waits.get(queue, [])))) for queue, counts in sorted(by_queue.items())
    ]
    view.waits = Waits.of(merge_buckets(b for row in minutes for b in row.waits.values()))
    return view


def _age(ts: float) -> str:
    """How long ago ``ts`` (seconds since the epoch) was: ``4s``, ``3m 20s``, ``2h 5m``."""
    from .. import _clock

    seconds = max(0, int(_clock.now() - ts))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60}m"




# -- batches -------------------------------------------------------------------------------------
@dataclass
class BatchFailure:
    """A failed job of a batch, and the connection whose failed store holds it."""

    connection: str
    job: FailedJob


def _batch_failures(manager: QueueManager, batch_id: str) -> tuple[list[BatchFailure], list[str]]:
    """The failed jobs of ``batch_id`` among each connection's latest :data:`FAILED_SCAN`
    (a failed job keeps its envelope, whose meta names its batch); and the
    connections that could not be read."""
    found: list[BatchFailure] = []
    unreadable: list[str] = []
    for name, driver in sorted(manager.connections.items()):
        try:
            scanned = driver.failed_jobs(limit=FAILED_SCAN)
        except Exception as exc:  # noqa: BLE001 - one unreachable backend must not take the page down
            unreadable.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        for failed in scanned:
            if failed.job is not None and (failed.job.meta or {}).get("batch") == batch_id:
                found.append(BatchFailure(name, failed))
    return found, unreadable
