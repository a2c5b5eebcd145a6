"""The queue dashboard: a Flask blueprint mounted by :class:`~rainier_sync.flask.RainierSync`.

It shows, per connection and queue, the ready / delayed / reserved / failed
counts, the fleet's throughput chart (server-rendered SVG, nothing fetched
from elsewhere; the Workers page's, read from the counts every worker adds to
the lock store), the failed jobs with retry and forget buttons, a failed job's
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
failed job's page shows the first :data:`ERROR_CUT` bytes of its error and of
its traceback (which closes with the error: that is shown once), and links
each whole, as plain text (``.../error``, ``.../traceback``), sent as it is
with ``nosniff`` and a sandboxing CSP. Any job id (or connection name) fits in
its URL: one that is not plain (``/``, ``%``, spaces, ``?``, ``#``, non-ASCII,
``.`` or ``..``...) is written as ``~`` and its URL-safe base64.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import secrets
from typing import TYPE_CHECKING

from flask import Blueprint, Response, abort, current_app, redirect, render_template, request, session, url_for
from werkzeug.routing import BaseConverter, ValidationError

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
    queue_names,
)

if TYPE_CHECKING:
    from flask.blueprints import BlueprintSetupState
    from werkzeug.wrappers import Response as BaseResponse

    from ..batch import Batch
    from ..drivers.base import BaseQueue
    from ..types import FailedJob

__all__ = ["blueprint", "csrf_token", "queue_names", "CSRF_SESSION_KEY", "ERROR_PREVIEW", "ERROR_CUT"]

#: Where the CSRF token lives in the Flask session.
CSRF_SESSION_KEY = "_rainier_sync_csrf"

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
    policy = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    if response.mimetype == "text/plain":
        # Plain text is sent as it is: nosniff keeps a browser from reading it as HTML, and
        # the sandbox gives it no origin and no script should one do so anyway.
        policy += "; sandbox"
    response.headers["Content-Security-Policy"] = policy
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

    manager = get_state().manager
    limit = request.args.get("limit", FAILED_LIST, type=int) or FAILED_LIST
    limit = max(1, min(limit, 500))
    views = [_connection_view(manager, name, driver, limit) for name, driver in sorted(manager.connections.items())]
    return render_template(
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
        notice=_notice(),
    )


@blueprint.route("/workers", methods=["GET"])
def workers() -> str:
    from . import get_state

    manager = get_state().manager
    return render_template(
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


@blueprint.route("/<rainier_sync_segment:connection>/queues/<rainier_sync_segment:queue>", methods=["GET"])
def browse(connection: str, queue: str) -> str:
    from . import get_state

    driver = _driver(connection)
    state = request.args.get("state", "ready")
    if state not in JOB_STATES:
        abort(400, description=f"state must be one of {', '.join(JOB_STATES)}, not {state!r}.")
    name = request.args.get("name", "").strip()
    page = request.args.get("page", 1, type=int) or 1
    view = browse_view(get_state().manager, connection, driver, queue, state, name, page)
    return render_template(
        "rainier_sync/browse.html", view=view, page_size=PAGE_SIZE, when=_when, age=_age, payload_text=_payload_text
    )


@blueprint.route("/<rainier_sync_segment:connection>/jobs/<rainier_sync_segment:job_id>", methods=["GET"])
def job(connection: str, job_id: str) -> tuple[str, int]:
    from . import get_state

    driver = _driver(connection)
    view = job_view(get_state().manager, connection, driver, job_id)
    found = view.row is not None or view.error is not None
    body = render_template(
        "rainier_sync/job.html",
        view=view,
        when=_when,
        age=_age,
        payload=_payload_text(view.row.listed.job.payload, indent=2) if view.row is not None else "",
        meta=_payload_text(view.row.listed.job.meta, indent=2) if view.row and view.row.listed.job.meta else "",
    )
    return body, 200 if found else 404


def _failed(connection: str, job_id: str) -> FailedJob:
    job = _driver(connection).failed_job(job_id)
    if job is None:
        abort(404, description=f"No failed job {job_id!r} on connection {connection!r}.")
    return job


@blueprint.route("/<rainier_sync_segment:connection>/failed/<rainier_sync_segment:job_id>", methods=["GET"])
def failed_job(connection: str, job_id: str) -> str:
    job = _failed(connection, job_id)
    return render_template(
        "rainier_sync/failed_job.html",
        connection=connection,
        job=job,
        failure=_failure_view(job.exception),
        cut_kib=ERROR_CUT // 1024,
        when=_when,
        payload=_payload_text(job.payload, indent=2),
    )


def _plain_text(text: str) -> Response:
    """``text`` as it is, as text/plain (UTF-8); :func:`_headers` adds what keeps it inert."""
    return Response(text, mimetype="text/plain")


@blueprint.route("/<rainier_sync_segment:connection>/failed/<rainier_sync_segment:job_id>/error", methods=["GET"])
def failed_error(connection: str, job_id: str) -> Response:
    """A failed job's whole error, as plain text."""
    return _plain_text(_failed(connection, job_id).error)


@blueprint.route(
    "/<rainier_sync_segment:connection>/failed/<rainier_sync_segment:job_id>/traceback", methods=["GET"]
)
def failed_traceback(connection: str, job_id: str) -> Response:
    """A failed job's whole traceback, as plain text."""
    job = _failed(connection, job_id)
    if not job.exception.traceback:
        abort(404, description=f"Failed job {job_id!r} has no traceback.")
    return _plain_text(job.exception.traceback)


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
        abort(404, description=f"Batches need a lock store: {STORE_HINT}.")
    if not manager.cancel_batch(batch_id):
        return redirect(url_for(".batches", notice="batch-missing", job=batch_id), code=303)
    return redirect(url_for(".batch", batch_id=batch_id, notice="batch-cancelled", job=batch_id), code=303)
