"""The queue dashboard: a Flask blueprint mounted by :class:`~rainier_sync.flask.RainierSync`.

Its pages are built by :mod:`rainier_sync.dashboard` (as every host of the
dashboard builds them); this module routes to them and guards them.

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

import secrets
from typing import TYPE_CHECKING

from flask import Blueprint, Response, abort, current_app, redirect, render_template, request, session, url_for
from werkzeug.routing import BaseConverter, ValidationError

from ..dashboard.pages import PageError, PageRequest, build_page, csrf_matches, security_headers
from ..dashboard.routes import ROUTES, decode_segment, encode_segment
from ..dashboard.views import ERROR_CUT, ERROR_PREVIEW, queue_names

if TYPE_CHECKING:
    from flask.blueprints import BlueprintSetupState
    from werkzeug.wrappers import Response as BaseResponse

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
    """A job id or connection name as one path segment that round-trips
    (:func:`~rainier_sync.dashboard.routes.encode_segment`).

    The server decodes ``%2F`` before routing and browsers resolve ``.`` and
    ``..`` segments, so a value that is not plain is written as ``~`` and its
    URL-safe base64 (no padding); a plain one (letters, digits, ``_.:@-``,
    not starting with ``~``) stays as it is, readable and stable.
    """

    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        try:
            return decode_segment(value)
        except ValueError:
            raise ValidationError() from None

    def to_url(self, value: str) -> str:
        return encode_segment(value)


def _add_converter(state: BlueprintSetupState) -> None:
    state.app.url_map.converters["rainier_sync_segment"] = SegmentConverter


# Before the routes: a rule needs its converter when it is added to the app's map.
blueprint.record(_add_converter)


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
        if not csrf_matches(sent, session.get(CSRF_SESSION_KEY)):
            abort(400, description="The CSRF token is missing or does not match this session; reload the page.")


@blueprint.after_request
def _headers(response: Response) -> Response:
    response.headers.update(security_headers(response.mimetype))
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


# -- pages: each built by rainier_sync.dashboard ----------------------------------------------------
def _serve(**values: str) -> BaseResponse | tuple[str, int]:
    from . import get_state

    endpoint = (request.endpoint or "").removeprefix("rainier_sync.")
    page_request = PageRequest(
        endpoint=endpoint,
        values=values,
        args=request.args.to_dict(flat=True),
        form=request.form.to_dict(flat=True),
        url_for=url_for,
        csrf_token=csrf_token,
        # The app's Jinja environment: a template of the same name in the app's own folder overrides one.
        render=lambda template, context: render_template(template, **context),
    )
    try:
        page = build_page(get_state().manager, page_request)
    except PageError as exc:
        abort(exc.status, description=exc.description)
    if page.location is not None:
        return redirect(page.location, code=page.status)
    if page.mimetype == "text/plain":
        # Sent as it is; _headers() adds what keeps it inert.
        return Response(page.body, status=page.status, mimetype="text/plain")
    return page.body, page.status


def _flask_rule(path: str) -> str:
    return path.replace("<", "<rainier_sync_segment:")


for _route in ROUTES:
    blueprint.add_url_rule(_flask_rule(_route.path), _route.endpoint, _serve, methods=[_route.method])
