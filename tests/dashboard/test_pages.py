"""The page builders: the same pages on every host, and URLs that carry any id."""

from __future__ import annotations

import io
import re
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from rainier_sync.dashboard.routes import build_url, match
from rainier_sync.dashboard.server import DashboardApp
from rainier_sync.drivers import MemoryQueue
from tests.flask.apps import make_app, put_failed

AWKWARD = ["plain-id", "emails/1700000000000-0", "..", ".", "~tilde", "tenant/../emails 50% ?#ü", "a" * 300]


@pytest.mark.parametrize("job_id", AWKWARD)
def test_every_id_round_trips_through_its_url(job_id: str) -> None:
    url = build_url("/queues", "rainier_sync.retry", {"connection": "main/eu", "job_id": job_id})
    assert url.startswith("/queues/")
    from urllib.parse import unquote

    found = match(unquote(url.removeprefix("/queues")))
    assert [(route.endpoint, values) for route, values in found] == [
        ("retry", {"connection": "main/eu", "job_id": job_id})
    ]


def test_query_values_are_kept_and_none_is_left_out() -> None:
    url = build_url("", "rainier_sync.browse", {"connection": "c", "queue": "q", "state": "ready", "name": None})
    assert url == "/c/queues/q?state=ready"


def call(app: DashboardApp, path: str, cookie: str = "") -> tuple[str, dict[str, str], str]:
    environ: dict[str, Any] = {"SCRIPT_NAME": "/queues", "PATH_INFO": path, "HTTP_HOST": "127.0.0.1"}
    if cookie:
        environ["HTTP_COOKIE"] = cookie
    setup_testing_defaults(environ)
    environ["wsgi.input"] = io.BytesIO()
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, headers

    body = b"".join(app(environ, start_response)).decode("utf-8")
    cookies = [value for key, value in seen["headers"] if key == "Set-Cookie"]
    return seen["status"], dict(seen["headers"]) | {"_cookies": "; ".join(c.split(";")[0] for c in cookies)}, body


def test_flask_and_the_standalone_server_send_the_same_pages() -> None:
    flask_app, manager = make_app(authorize=lambda: True)
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    for job_id in ("emails/1", "<b>bold</b>"):
        put_failed(driver, job_id, error="RuntimeError: <script>alert(1)</script>")
    standalone = DashboardApp(manager, token=None)
    client = flask_app.test_client()
    cookie = ""
    for path in ["/", "/workers", "/batches", "/primary/queues/default", "/primary/failed/~ZW1haWxzLzE"]:
        flask_page = client.get("/queues" + path)
        status, headers, body = call(standalone, path, cookie)
        cookie = cookie or headers["_cookies"]
        assert status.startswith(str(flask_page.status_code)), path
        for name in ("Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy", "Cache-Control"):
            assert headers[name] == flask_page.headers[name], (path, name)
        tokens = re.compile(r'name="csrf_token" value="[^"]+"')
        assert tokens.sub("TOKEN", body) == tokens.sub("TOKEN", flask_page.get_data(as_text=True)), path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>" not in body


def test_an_app_template_overrides_the_flask_dashboards() -> None:
    from jinja2 import DictLoader

    flask_app, _ = make_app(authorize=lambda: True)
    flask_app.jinja_loader = DictLoader({"rainier_sync/workers.html": "the app's own: {{ minutes }} minutes"})  # type: ignore[method-assign,assignment]
    page = flask_app.test_client().get("/queues/workers")
    assert page.get_data(as_text=True) == "the app's own: 60 minutes"


def test_a_login_lasts_twelve_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    from http.cookies import SimpleCookie

    from rainier_sync.dashboard import server

    _, manager = make_app(authorize=lambda: True)
    app = DashboardApp(manager, token="x" * 16)
    sid, cookie = app._new_session("")
    jar: SimpleCookie = SimpleCookie()
    jar.load(cookie.split(";")[0])
    now = server.time.time()
    monkeypatch.setattr(server.time, "time", lambda: now + server.SESSION_SECONDS - 5)
    assert app._session(jar) == sid
    monkeypatch.setattr(server.time, "time", lambda: now + server.SESSION_SECONDS + 5)
    assert app._session(jar) is None
    assert server.SESSION_SECONDS == 12 * 3600


@pytest.mark.parametrize(
    ("bind", "parsed"),
    [("127.0.0.1:8000", ("127.0.0.1", 8000)), ("[::1]:0", ("::1", 0)), ("localhost:80", ("localhost", 80))],
)
def test_bind_addresses(bind: str, parsed: tuple[str, int]) -> None:
    from rainier_sync.dashboard.server import is_loopback, parse_bind

    assert parse_bind(bind) == parsed
    assert is_loopback(parsed[0])
    assert is_loopback("127.8.9.10") and not is_loopback("0.0.0.0") and not is_loopback("::")
