"""What the dashboard's pages show, computed from the manager: connections
with their queues and failed jobs, the schedule, the charts, the fleet and a
batch's failed jobs. No Flask here: the blueprint's views render these."""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..types import FailedJob, QueueCounts

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..fleet import MinuteCounts, WorkerInfo
    from ..manager import QueueManager
    from . import Throughput

#: How many failed jobs are scanned to count them per queue.
FAILED_SCAN = 1000
#: How many failed jobs a page lists per connection.
FAILED_LIST = 50
#: How many characters of an error a list page shows (the job's page shows it all).
ERROR_PREVIEW = 300
#: How many minutes of the fleet's throughput the Workers page charts.
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


def _payload_text(payload: Any, *, indent: int | None = None, limit: int | None = None) -> str:
    text = json.dumps(payload, indent=indent, ensure_ascii=False, sort_keys=True, default=repr)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


@dataclass
class Chart:
    """The throughput chart as plain numbers for the SVG template."""

    width: int
    height: int
    bars: list[dict[str, Any]]
    peak: int
    backlog_points: str
    backlog_dots: list[dict[str, Any]]
    backlog_peak: int
    backlog_last: int | None
    labels: list[dict[str, Any]]


def build_chart(throughput: Throughput, width: int = 600, height: int = 110) -> Chart:
    """Bars: jobs finished per minute in this process (processed over failed);
    line: the sampled backlog."""
    minutes = throughput.finished()
    peak = max((p + f for _, p, f in minutes), default=0)
    scale = (height - 20) / peak if peak else 0.0
    slot = width / max(len(minutes), 1)
    bars: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    for index, (minute, processed, failed) in enumerate(minutes):
        x = round(index * slot + 2, 1)
        w = round(max(slot - 4, 1), 1)
        base = height - 14
        hp = round(processed * scale, 1)
        hf = round(failed * scale, 1)
        stamp = datetime.datetime.fromtimestamp(minute * 60, tz=datetime.timezone.utc).strftime("%H:%M")
        title = f"{stamp} UTC: {processed} processed, {failed} failed"
        bars.append({"x": x, "y": round(base - hp, 1), "w": w, "h": hp, "fill": "#2e7d32", "title": title})
        bars.append({"x": x, "y": round(base - hp - hf, 1), "w": w, "h": hf, "fill": "#c62828", "title": title})
        if index % 5 == 0 or index == len(minutes) - 1:
            labels.append({"x": round(x + w / 2, 1), "text": stamp})
    samples = throughput.samples()
    backlog_peak = max((q for _, q, _ in samples), default=0)
    dots: list[dict[str, Any]] = []
    if minutes:
        start = minutes[0][0] * 60
        span = len(minutes) * 60
        bscale = (height - 20) / backlog_peak if backlog_peak else 0.0
        for when, queued, failed in samples:
            stamp = datetime.datetime.fromtimestamp(when, tz=datetime.timezone.utc).strftime("%H:%M:%S")
            dots.append(
                {
                    "x": round(max(0.0, min(width, (when - start) / span * width)), 1),
                    "y": round(height - 14 - queued * bscale, 1),
                    "title": f"{stamp} UTC: {queued} queued, {failed} failed",
                }
            )
    points = " ".join(f"{d['x']},{d['y']}" for d in dots)
    return Chart(
        width=width,
        height=height,
        bars=bars,
        peak=peak,
        backlog_points=points,
        backlog_dots=dots,
        backlog_peak=backlog_peak,
        backlog_last=samples[-1][1] if samples else None,
        labels=labels,
    )


#: The fleet chart's segments, bottom up: outcome, colour, words.
FLEET_SEGMENTS = (
    ("processed", "#2e7d32", "processed"),
    ("released", "#f9a825", "released for a retry"),
    ("failed", "#c62828", "failed"),
    ("deferred", "#6a1b9a", "deferred"),
)


def build_fleet_chart(minutes: list[MinuteCounts], width: int = 600, height: int = 110) -> Chart:
    """Bars: what every worker finished per minute (processed, released, failed, deferred, stacked)."""
    totals = [[row.total(outcome) for outcome, _, _ in FLEET_SEGMENTS] for row in minutes]
    peak = max((sum(counts) for counts in totals), default=0)
    scale = (height - 20) / peak if peak else 0.0
    slot = width / max(len(minutes), 1)
    bars: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    base = height - 14
    for index, (row, counts) in enumerate(zip(minutes, totals, strict=True)):
        x = round(index * slot + 1, 1)
        w = round(max(slot - 2, 1), 1)
        stamp = datetime.datetime.fromtimestamp(row.minute, tz=datetime.timezone.utc).strftime("%H:%M")
        title = f"{stamp} UTC: " + ", ".join(
            f"{n} {words}" for n, (_, _, words) in zip(counts, FLEET_SEGMENTS, strict=True)
        )
        top = float(base)
        for n, (_, fill, _) in zip(counts, FLEET_SEGMENTS, strict=True):
            h = round(n * scale, 1)
            top -= h
            bars.append({"x": x, "y": round(top, 1), "w": w, "h": h, "fill": fill, "title": title})
        if index % 10 == 0 or index == len(minutes) - 1:
            labels.append({"x": round(x + w / 2, 1), "text": stamp})
    return Chart(
        width=width,
        height=height,
        bars=bars,
        peak=peak,
        backlog_points="",
        backlog_dots=[],
        backlog_peak=0,
        backlog_last=None,
        labels=labels,
    )


@dataclass
class FleetView:
    """The Workers page: the workers recorded in the lock store, and the fleet's throughput."""

    #: Whether the manager has a lock store (workers record themselves only in one).
    tracked: bool
    workers: list[WorkerInfo] = field(default_factory=list)
    chart: Chart | None = None
    #: The last :data:`FLEET_MINUTES` minutes by queue: ``(queue, {outcome: count})``.
    queues: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    error: str | None = None


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
    by_queue: dict[str, dict[str, int]] = {}
    for row in minutes:
        for queue, counts in row.by_queue.items():
            held = by_queue.setdefault(queue, {})
            for outcome, n in counts.items():
                held[outcome] = held.get(outcome, 0) + n
    view.queues = sorted(by_queue.items())
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
