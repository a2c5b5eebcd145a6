"""The dashboard's pages, built from the manager whatever serves them.

A host (the Flask blueprint, the ``rainier-sync dashboard`` server) routes a
request to an endpoint (:data:`~rainier_sync.dashboard.routes.ROUTES`), checks
who asks and the CSRF token, and calls :func:`build_page` with a
:class:`PageRequest`; it sends back the :class:`Page` it gets: rendered HTML,
a redirect after a POST, or a plain-text body, with its status and headers
(:func:`security_headers` included). A page that cannot be shown raises
:class:`PageError`. Everything a page shows goes through Jinja's autoescaping.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UniqueLockHeldError
from ..state.base import STORE_HINT
from ..types import JOB_STATES
from .browse import PAGE_SIZE, browse_view, job_view
from .charts import FLEET_SEGMENTS, WAIT_LINES, duration
from .views import (
    ERROR_CUT,
    ERROR_PREVIEW,
    FAILED_LIST,
    FAILED_SCAN,
    FLEET_MINUTES,
    _age,
    _batch_failures,
    _clip,
    _connection_view,
    _failure_view,
    _fleet_view,
    _payload_text,
    _schedule_view,
    _throughput_view,
    _when,
)

if TYPE_CHECKING:
    import jinja2

    from ..batch import Batch
    from ..drivers.base import BaseQueue
    from ..manager import QueueManager
    from ..types import FailedJob

__all__ = [
    "Page",
    "PageError",
    "PageRequest",
    "build_page",
    "csrf_matches",
    "security_headers",
    "static_file",
    "TEMPLATES",
    "STATIC",
]

#: The pages' Jinja templates (``rainier_sync/*.html``) and their stylesheet.
TEMPLATES = Path(__file__).resolve().parent.parent / "flask" / "templates"
STATIC = Path(__file__).resolve().parent.parent / "flask" / "static"

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


class PageError(Exception):
    """The page cannot be shown: the host answers ``status`` with ``description``."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


@dataclass(frozen=True)
class PageRequest:
    """What a page is built from, as the host read it from the request."""

    #: The route's endpoint (``index``, ``retry``...).
    endpoint: str
    #: The path's segments, decoded (``connection``, ``queue``, ``job_id``, ``batch_id``).
    values: Mapping[str, str]
    #: The query string's parameters (first value of each).
    args: Mapping[str, str]
    #: The URL of an endpoint (``rainier_sync.index``) with its segments and query parameters.
    url_for: Callable[..., str]
    #: This session's CSRF token (called only by pages that have a form).
    csrf_token: Callable[[], str]
    form: Mapping[str, str] = field(default_factory=dict)
    #: How the host renders a template with a page's context, when it has a Jinja
    #: environment of its own (Flask's: the app's templates may override the pages');
    #: None renders the shipped templates with Jinja2 directly.
    render: Callable[[str, dict[str, Any]], str] | None = None


@dataclass
class Page:
    """What the host sends back."""

    status: int = 200
    body: str = ""
    #: ``text/html`` or ``text/plain`` (always UTF-8).
    mimetype: str = "text/html"
    #: Where a redirect (303) points.
    location: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """Every header the page is sent with: content type, security headers and, for a redirect, Location."""
        headers = {"Content-Type": f"{self.mimetype}; charset=utf-8", **security_headers(self.mimetype)}
        if self.location is not None:
            headers["Location"] = self.location
        return headers


def security_headers(mimetype: str | None) -> dict[str, str]:
    """The headers every dashboard response carries: a CSP that allows only the
    stylesheet (no script, no frames, forms to this origin), ``nosniff``, no
    referrer to elsewhere and no caching; plain text is also sandboxed."""
    policy = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    if mimetype == "text/plain":
        # Plain text is sent as it is: nosniff keeps a browser from reading it as HTML, and
        # the sandbox gives it no origin and no script should one do so anyway.
        policy += "; sandbox"
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


def csrf_matches(sent: str | None, expected: object) -> bool:
    """Whether the CSRF token a POST ``sent`` is the session's ``expected`` one (compared in constant time)."""
    if not isinstance(expected, str) or not expected:
        return False
    return hmac.compare_digest((sent or "").encode(), expected.encode())


def static_file(name: str) -> bytes | None:
    """The bytes of the dashboard's static file ``name`` (its stylesheet), or None when there is none."""
    for path in STATIC.iterdir():
        if path.name == name and path.is_file():
            return path.read_bytes()
    return None


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(["html"], default_for_string=True, default=True),
    )


@dataclass(frozen=True)
class _Current:
    """``request`` in the templates: what the navigation needs of it."""

    endpoint: str


def _render(req: PageRequest, template: str, status: int = 200, **context: Any) -> Page:
    if req.render is not None:
        return Page(status=status, body=req.render(template, context))
    shown = _environment().get_template(template)
    body = shown.render(
        url_for=req.url_for,
        rainier_sync_csrf_token=req.csrf_token,
        request=_Current(f"rainier_sync.{req.endpoint}"),
        **context,
    )
    return Page(status=status, body=body)


def _redirect(req: PageRequest, endpoint: str, **values: Any) -> Page:
    return Page(status=303, location=req.url_for(f"rainier_sync.{endpoint}", **values))


def _int_arg(req: PageRequest, name: str, default: int) -> int:
    try:
        return int(req.args[name])
    except (KeyError, ValueError):
        return default


def _notice(req: PageRequest) -> str | None:
    """The notice a redirect after a POST asked for (``?notice=...``), if any."""
    code = req.args.get("notice")
    if code not in _NOTICES:
        return None
    return _NOTICES[code].format(job=req.args.get("job", ""), count=_int_arg(req, "count", 0))


def _driver(manager: QueueManager, name: str) -> BaseQueue:
    connections = manager.connections
    if name not in connections:
        raise PageError(404, f"No connection named {name!r}.")
    return connections[name]


def _failed(manager: QueueManager, connection: str, job_id: str) -> FailedJob:
    job = _driver(manager, connection).failed_job(job_id)
    if job is None:
        raise PageError(404, f"No failed job {job_id!r} on connection {connection!r}.")
    return job


# -- pages ---------------------------------------------------------------------------------------
def _index(manager: QueueManager, req: PageRequest) -> Page:
    limit = _int_arg(req, "limit", FAILED_LIST) or FAILED_LIST
    limit = max(1, min(limit, 500))
    views = [_connection_view(manager, name, driver, limit) for name, driver in sorted(manager.connections.items())]
    return _render(
        req,
        "rainier_sync/index.html",
        connections=views,
        schedule=_schedule_view(manager),
        throughput=_throughput_view(manager),
        minutes=FLEET_MINUTES,
        segments=FLEET_SEGMENTS,
        when=_when,
        payload_text=_payload_text,
        clip=_clip,
        error_preview=ERROR_PREVIEW,
        notice=_notice(req),
    )


def _workers(manager: QueueManager, req: PageRequest) -> Page:
    return _render(
        req,
        "rainier_sync/workers.html",
        fleet=_fleet_view(manager),
        connections=manager.connections,
        minutes=FLEET_MINUTES,
        segments=FLEET_SEGMENTS,
        wait_lines=WAIT_LINES,
        when=_when,
        age=_age,
        duration=duration,
    )


def _browse(manager: QueueManager, req: PageRequest) -> Page:
    connection, queue = req.values["connection"], req.values["queue"]
    driver = _driver(manager, connection)
    state = req.args.get("state", "ready")
    if state not in JOB_STATES:
        raise PageError(400, f"state must be one of {', '.join(JOB_STATES)}, not {state!r}.")
    name = req.args.get("name", "").strip()
    page = _int_arg(req, "page", 1) or 1
    view = browse_view(manager, connection, driver, queue, state, name, page)
    return _render(
        req,
        "rainier_sync/browse.html",
        view=view,
        page_size=PAGE_SIZE,
        when=_when,
        age=_age,
        payload_text=_payload_text,
    )


def _job(manager: QueueManager, req: PageRequest) -> Page:
    connection, job_id = req.values["connection"], req.values["job_id"]
    driver = _driver(manager, connection)
    view = job_view(manager, connection, driver, job_id)
    found = view.row is not None or view.error is not None
    return _render(
        req,
        "rainier_sync/job.html",
        status=200 if found else 404,
        view=view,
        when=_when,
        age=_age,
        payload=_payload_text(view.row.listed.job.payload, indent=2) if view.row is not None else "",
        meta=_payload_text(view.row.listed.job.meta, indent=2) if view.row and view.row.listed.job.meta else "",
    )


def _failed_job(manager: QueueManager, req: PageRequest) -> Page:
    connection = req.values["connection"]
    job = _failed(manager, connection, req.values["job_id"])
    return _render(
        req,
        "rainier_sync/failed_job.html",
        connection=connection,
        job=job,
        failure=_failure_view(job.exception),
        cut_kib=ERROR_CUT // 1024,
        when=_when,
        payload=_payload_text(job.payload, indent=2),
    )


def _failed_error(manager: QueueManager, req: PageRequest) -> Page:
    """A failed job's whole error, as plain text."""
    return Page(body=_failed(manager, req.values["connection"], req.values["job_id"]).error, mimetype="text/plain")


def _failed_traceback(manager: QueueManager, req: PageRequest) -> Page:
    """A failed job's whole traceback, as plain text."""
    job_id = req.values["job_id"]
    job = _failed(manager, req.values["connection"], job_id)
    if not job.exception.traceback:
        raise PageError(404, f"Failed job {job_id!r} has no traceback.")
    return Page(body=job.exception.traceback, mimetype="text/plain")


def _retry(manager: QueueManager, req: PageRequest) -> Page:
    connection, job_id = req.values["connection"], req.values["job_id"]
    _driver(manager, connection)
    try:
        done = manager.retry_failed(job_id, connection=connection)
    except UniqueLockHeldError:
        return _redirect(req, "index", notice="held", job=job_id)
    return _redirect(req, "index", notice="retried" if done else "missing", job=job_id)


def _forget(manager: QueueManager, req: PageRequest) -> Page:
    connection, job_id = req.values["connection"], req.values["job_id"]
    done = _driver(manager, connection).forget_failed(job_id)
    return _redirect(req, "index", notice="forgotten" if done else "missing", job=job_id)


def _pause(manager: QueueManager, req: PageRequest) -> Page:
    connection, queue = req.values["connection"], req.values["queue"]
    _driver(manager, connection)
    manager.pause(queue, connection=connection)
    return _redirect(req, "index", notice="paused", job=queue)


def _resume(manager: QueueManager, req: PageRequest) -> Page:
    connection, queue = req.values["connection"], req.values["queue"]
    _driver(manager, connection)
    manager.resume(queue, connection=connection)
    return _redirect(req, "index", notice="resumed", job=queue)


def _retry_all(manager: QueueManager, req: PageRequest) -> Page:
    connection = req.values["connection"]
    driver = _driver(manager, connection)
    # Ids first, so a job that is retried and fails again meanwhile is not retried twice.
    ids = [job.id for job in driver.failed_jobs(limit=max(driver.failed_count(), 1))]
    done = 0
    for job_id in ids:
        try:
            done += manager.retry_failed(job_id, connection=connection)
        except UniqueLockHeldError:
            pass  # kept in the failed list, where the page still shows it
    return _redirect(req, "index", notice="retried-all", count=done)


def _batches(manager: QueueManager, req: PageRequest) -> Page:
    listed: list[Batch] = []
    error = None
    if manager.locks is not None:
        try:
            listed = manager.batches()
        except Exception as exc:  # noqa: BLE001 - an unreachable lock store must not take the page down
            error = f"{type(exc).__name__}: {exc}"
    return _render(
        req,
        "rainier_sync/batches.html",
        batches=listed,
        has_locks=manager.locks is not None,
        error=error,
        when=_when,
        notice=_notice(req),
    )


def _batch(manager: QueueManager, req: PageRequest) -> Page:
    batch_id = req.values["batch_id"]
    if manager.locks is None:
        return _render(req, "rainier_sync/batches.html", batches=[], has_locks=False, error=None, notice=None)
    try:
        found = manager.find_batch(batch_id)
    except Exception as exc:  # noqa: BLE001 - say why rather than fail with a 500
        error = f"{type(exc).__name__}: {exc}"
        return _render(req, "rainier_sync/batches.html", batches=[], has_locks=True, error=error, notice=None)
    if found is None:
        raise PageError(404, f"No batch {batch_id!r}: it expired, or never was.")
    failures, unreadable = _batch_failures(manager, batch_id)
    return _render(
        req,
        "rainier_sync/batch.html",
        batch=found,
        failures=failures,
        unreadable=unreadable,
        scan=FAILED_SCAN,
        when=_when,
        clip=_clip,
        notice=_notice(req),
    )


def _cancel_batch(manager: QueueManager, req: PageRequest) -> Page:
    batch_id = req.values["batch_id"]
    if manager.locks is None:
        raise PageError(404, f"Batches need a lock store: {STORE_HINT}.")
    if not manager.cancel_batch(batch_id):
        return _redirect(req, "batches", notice="batch-missing", job=batch_id)
    return _redirect(req, "batch", batch_id=batch_id, notice="batch-cancelled", job=batch_id)


_BUILDERS: dict[str, Callable[[QueueManager, PageRequest], Page]] = {
    "index": _index,
    "workers": _workers,
    "browse": _browse,
    "job": _job,
    "failed_job": _failed_job,
    "failed_error": _failed_error,
    "failed_traceback": _failed_traceback,
    "retry": _retry,
    "forget": _forget,
    "pause": _pause,
    "resume": _resume,
    "retry_all": _retry_all,
    "batches": _batches,
    "batch": _batch,
    "cancel_batch": _cancel_batch,
}


def build_page(manager: QueueManager, req: PageRequest) -> Page:
    """The page ``req.endpoint`` names, built from ``manager``; :class:`PageError` when it cannot be shown.

    The host has already checked who asks and, for a POST, the CSRF token."""
    try:
        builder = _BUILDERS[req.endpoint]
    except KeyError:
        raise PageError(404, f"No dashboard page {req.endpoint!r}.") from None
    return builder(manager, req)
