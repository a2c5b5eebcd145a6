"""The queue dashboard: a Flask blueprint mounted by :class:`~rainier_sync.flask.RainierSync`.

It shows, per connection and queue, the ready / delayed / reserved / failed
counts, a throughput chart (server-rendered SVG, nothing fetched from
elsewhere), the failed jobs with retry and forget buttons, a failed job's
detail page, the manager's schedule (when it has one) and, with a lock store,
the batches kept, each with its counts, failed jobs and a cancel button. The
Workers page lists the workers recorded in the lock store, in any process,
and charts what the whole fleet finished in each of the last
:data:`FLEET_MINUTES` minutes.

Every request, static files included, is refused with 403 until the app gives
an ``authorize`` callback that returns true for it, and with 503 while the
app's secret key is missing or one rainier_sync has published (the extension
refuses to boot with one; this catches a key changed later). Every POST must carry the
session-bound CSRF token the pages embed (form field ``csrf_token`` or header
``X-CSRF-Token``); one without it is refused with 400. Payloads and errors are
rendered through Jinja's autoescaping only.

List pages show the first :data:`ERROR_PREVIEW` characters of each error; a
failed job's page shows everything. Any job id (or connection name) fits in
its URL: one that is not plain (``/``, ``%``, spaces, ``?``, ``#``, non-ASCII,
``.`` or ``..``...) is written as ``~`` and its URL-safe base64.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hmac
import json
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, abort, current_app, redirect, render_template, request, session, url_for
from werkzeug.routing import BaseConverter, ValidationError

from ..errors import UniqueLockHeldError
from ..types import FailedJob, QueueCounts

if TYPE_CHECKING:
    from flask.blueprints import BlueprintSetupState
    from werkzeug.wrappers import Response as BaseResponse

    from ..batch import Batch
    from ..drivers.base import BaseQueue
    from ..fleet import MinuteCounts, WorkerInfo
    from ..manager import QueueManager
    from . import Throughput

__all__ = ["blueprint", "csrf_token", "queue_names", "CSRF_SESSION_KEY", "ERROR_PREVIEW"]

#: Where the CSRF token lives in the Flask session.
CSRF_SESSION_KEY = "_rainier_sync_csrf"
#: How many failed jobs are scanned to count them per queue.
FAILED_SCAN = 1000
#: How many failed jobs a page lists per connection.
FAILED_LIST = 50
#: How many characters of an error a list page shows (the job's page shows it all).
ERROR_PREVIEW = 300
#: How many minutes of the fleet's throughput the Workers page charts.
FLEET_MINUTES = 60

blueprint = Blueprint(
    "rainier_sync",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)



class SegmentConverter(BaseConverter):
    """A job id or connection name as one path segment that round-trips.

    The server decodes ``%2F`` before routing and browsers resolve ``.`` and
    ``..`` segments, so a value that is not plain is written as ``~`` and its
    URL-safe base64 (no padding); a plain one (letters, digits, ``_.:@-``,
    not starting with ``~``) stays as it is, readable and stable.
    """

    regex = "[^/]+"
    _plain = re.compile(r"[A-Za-z0-9_.:@-]+")

    def to_python(self, value: str) -> str:
        if not value.startswith("~"):
            return value
        encoded = value[1:]
        try:
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            raise ValidationError() from None

    def to_url(self, value: str) -> str:
        if self._plain.fullmatch(value) and value not in (".", ".."):
            return value
        return "~" + base64.urlsafe_b64encode(value.encode("utf-8")).decode("ascii").rstrip("=")


def _add_converter(state: BlueprintSetupState) -> None:
    state.app.url_map.converters["rainier_sync_segment"] = SegmentConverter


# Before the routes: a rule needs its converter when it is added to the app's map.
blueprint.record(_add_converter)

_NOTICES = {
    "retried": "Job {job} was queued again.",
    "retried-all": "{count} failed job(s) were queued again.",
    "forgotten": "Job {job} was deleted.",
    "missing": "There is no failed job {job} any more.",
    "held": "Job {job} was not queued again: it is unique and a copy of it is queued or running now.",
    "paused": "Queue {job} is paused: workers stop claiming from it within their sleep.",
    "resumed": "Queue {job} is worked again.",
    "batch-cancelled": "Batch {job} was cancelled: its jobs not yet started are skipped.",
    "batch-missing": "There is no batch {job} any more (it expired, or never was).",
}


# -- guards ---------------------------------------------------------------------------------
@blueprint.before_request
def _guard() -> None:
    from . import _SECRET_KEY_ADVICE, _secret_key_problem, get_state

    authorize = get_state().authorize
    if authorize is None:
        abort(403)
    # Before authorize(), which may trust a session that anyone could have signed.
    problem = _secret_key_problem(current_app)
    if problem is not None:
        current_app.logger.error("rainier_sync dashboard: refusing %s %s: %s", request.method, request.path, problem)
        abort(503, description=f"The queue dashboard is turned off: {problem}. {_SECRET_KEY_ADVICE}.")
    if not authorize():
        abort(403)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        sent = request.form.get("csrf_token") or request.headers.get("X-CSRF-Token") or ""
        expected = session.get(CSRF_SESSION_KEY)
        if not isinstance(expected, str) or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            abort(400, description="The CSRF token is missing or does not match this session; reload the page.")


@blueprint.after_request
def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def csrf_token() -> str:
    """This session's CSRF token (created on first use)."""
    if not current_app.secret_key:
        raise RuntimeError("the rainier_sync dashboard needs app.secret_key (SECRET_KEY) to sign its CSRF token")
    token = session.get(CSRF_SESSION_KEY)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        session[CSRF_SESSION_KEY] = token
    return token


@blueprint.app_template_global("rainier_sync_csrf_token")
def _csrf_global() -> str:
    return csrf_token()


# -- what the pages show ------------------------------------------------------------------
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
        view.can_pause = manager.locks is not None and driver.driver.needs_a_worker()
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


def _driver(name: str) -> BaseQueue:
    from . import get_state

    connections = get_state().manager.connections
    if name not in connections:
        abort(404, description=f"No connection named {name!r}.")
    return connections[name]


def _notice() -> str | None:
    """The notice a redirect after a POST asked for (``?notice=...``), if any."""
    code = request.args.get("notice")
    if code not in _NOTICES:
        return None
    return _NOTICES[code].format(job=request.args.get("job", ""), count=request.args.get("count", 0, type=int))


# -- pages -------------------------------------------------------------------------------------
@blueprint.route("/", methods=["GET"])
def index() -> str:
    from . import get_state

    state = get_state()
    manager = state.manager
    limit = request.args.get("limit", FAILED_LIST, type=int) or FAILED_LIST
    limit = max(1, min(limit, 500))
    views = [_connection_view(manager, name, driver, limit) for name, driver in sorted(manager.connections.items())]
    reachable = [v for v in views if v.error is None]
    if reachable:
        state.throughput.sample(sum(v.queued_total for v in reachable), sum(v.failed_total for v in reachable))
    return render_template(
        "rainier_sync/index.html",
        connections=views,
        schedule=_schedule_view(manager),
        chart=build_chart(state.throughput),
        minutes=state.throughput.minutes,
        when=_when,
        payload_text=_payload_text,
        clip=_clip,
        error_preview=ERROR_PREVIEW,
        notice=_notice(),
    )


@blueprint.route("/workers", methods=["GET"])
def workers() -> str:
    from . import get_state

    return render_template(
        "rainier_sync/workers.html",
        fleet=_fleet_view(get_state().manager),
        minutes=FLEET_MINUTES,
        segments=FLEET_SEGMENTS,
        when=_when,
        age=_age,
    )


@blueprint.route("/<rainier_sync_segment:connection>/failed/<rainier_sync_segment:job_id>", methods=["GET"])
def failed_job(connection: str, job_id: str) -> str:
    driver = _driver(connection)
    job = driver.failed_job(job_id)
    if job is None:
        abort(404, description=f"No failed job {job_id!r} on connection {connection!r}.")
    return render_template(
        "rainier_sync/failed_job.html",
        connection=connection,
        job=job,
        when=_when,
        payload=_payload_text(job.payload, indent=2),
    )


@blueprint.route("/<rainier_sync_segment:connection>/failed/<rainier_sync_segment:job_id>/retry", methods=["POST"])
def retry(connection: str, job_id: str) -> BaseResponse:
    from . import get_state

    _driver(connection)
    try:
        done = get_state().manager.retry_failed(job_id, connection=connection)
    except UniqueLockHeldError:
        return redirect(url_for(".index", notice="held", job=job_id), code=303)
    return redirect(url_for(".index", notice="retried" if done else "missing", job=job_id), code=303)


@blueprint.route("/<rainier_sync_segment:connection>/failed/<rainier_sync_segment:job_id>/forget", methods=["POST"])
def forget(connection: str, job_id: str) -> BaseResponse:
    done = _driver(connection).forget_failed(job_id)
    return redirect(url_for(".index", notice="forgotten" if done else "missing", job=job_id), code=303)


@blueprint.route("/<rainier_sync_segment:connection>/queues/<rainier_sync_segment:queue>/pause", methods=["POST"])
def pause(connection: str, queue: str) -> BaseResponse:
    from . import get_state

    _driver(connection)
    get_state().manager.pause(queue, connection=connection)
    return redirect(url_for(".index", notice="paused", job=queue), code=303)


@blueprint.route("/<rainier_sync_segment:connection>/queues/<rainier_sync_segment:queue>/continue", methods=["POST"])
def resume(connection: str, queue: str) -> BaseResponse:
    from . import get_state

    _driver(connection)
    get_state().manager.resume(queue, connection=connection)
    return redirect(url_for(".index", notice="resumed", job=queue), code=303)


@blueprint.route("/<rainier_sync_segment:connection>/retry-failed", methods=["POST"])
def retry_all(connection: str) -> BaseResponse:
    from . import get_state

    driver = _driver(connection)
    manager = get_state().manager
    # Ids first, so a job that is retried and fails again meanwhile is not retried twice.
    ids = [job.id for job in driver.failed_jobs(limit=max(driver.failed_count(), 1))]
    done = 0
    for job_id in ids:
        try:
            done += manager.retry_failed(job_id, connection=connection)
        except UniqueLockHeldError:
            pass  # kept in the failed list, where the page still shows it
    return redirect(url_for(".index", notice="retried-all", count=done), code=303)


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


@blueprint.route("/batches", methods=["GET"])
def batches() -> str:
    from . import get_state

    manager = get_state().manager
    listed: list[Batch] = []
    error = None
    if manager.locks is not None:
        try:
            listed = manager.batches()
        except Exception as exc:  # noqa: BLE001 - an unreachable lock store must not take the page down
            error = f"{type(exc).__name__}: {exc}"
    return render_template(
        "rainier_sync/batches.html",
        batches=listed,
        has_locks=manager.locks is not None,
        error=error,
        when=_when,
        notice=_notice(),
    )


@blueprint.route("/batches/<rainier_sync_segment:batch_id>", methods=["GET"])
def batch(batch_id: str) -> str:
    from . import get_state

    manager = get_state().manager
    if manager.locks is None:
        return render_template("rainier_sync/batches.html", batches=[], has_locks=False, error=None, notice=None)
    try:
        found = manager.find_batch(batch_id)
    except Exception as exc:  # noqa: BLE001 - say why rather than fail with a 500
        error = f"{type(exc).__name__}: {exc}"
        return render_template("rainier_sync/batches.html", batches=[], has_locks=True, error=error, notice=None)
    if found is None:
        abort(404, description=f"No batch {batch_id!r}: it expired, or never was.")
    failures, unreadable = _batch_failures(manager, batch_id)
    return render_template(
        "rainier_sync/batch.html",
        batch=found,
        failures=failures,
        unreadable=unreadable,
        scan=FAILED_SCAN,
        when=_when,
        clip=_clip,
        notice=_notice(),
    )


@blueprint.route("/batches/<rainier_sync_segment:batch_id>/cancel", methods=["POST"])
def cancel_batch(batch_id: str) -> BaseResponse:
    from . import get_state

    manager = get_state().manager
    if manager.locks is None:
        abort(404, description="Batches need a lock store: give QueueManager locks=.")
    if not manager.cancel_batch(batch_id):
        return redirect(url_for(".batches", notice="batch-missing", job=batch_id), code=303)
    return redirect(url_for(".batch", batch_id=batch_id, notice="batch-cancelled", job=batch_id), code=303)
