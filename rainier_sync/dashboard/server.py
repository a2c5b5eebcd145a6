"""``rainier-sync dashboard``: the dashboard's pages as a small WSGI app, served
by the standard library's :mod:`wsgiref` for apps that run no web framework.

With a token (:data:`TOKEN_ENV`), a visitor logs in once by typing it on
``/login``; the server then keeps a session in a signed cookie (HttpOnly,
SameSite=Strict, :data:`SESSION_SECONDS` long, signed with a key made when the
server starts, so a restart logs everyone out). Without a token
(``--no-auth``, loopback binds only) every visitor gets a session, and a
request whose ``Host`` is not a loopback name is refused. Either way every
POST, the login's included, must carry the CSRF token tied to its session.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import logging
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .pages import PageError, PageRequest, build_page, csrf_matches, security_headers, static_file
from .routes import build_url, match

if TYPE_CHECKING:
    from ..manager import QueueManager

__all__ = [
    "DashboardApp",
    "TOKEN_ENV",
    "MIN_TOKEN",
    "SESSION_SECONDS",
    "parse_bind",
    "is_loopback",
    "make_dashboard_server",
]

#: The environment variable that holds the token visitors log in with.
TOKEN_ENV = "RAINIER_DASHBOARD_TOKEN"
#: The shortest token accepted, in characters.
MIN_TOKEN = 16
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600
#: The largest form body read.
MAX_FORM = 64 * 1024

SESSION_COOKIE = "rainier_sync_session"
LOGIN_COOKIE = "rainier_sync_login"

logger = logging.getLogger("rainier_sync.dashboard")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]

_LOGIN = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Log in · rainier_sync</title><link rel="stylesheet" href="{css}"></head>
<body><header><span class="brand">rainier_sync queues</span></header>
<main><h1>Log in</h1>{problem}
<form method="post" action="{action}">
<input type="hidden" name="csrf_token" value="{csrf}"><input type="hidden" name="next" value="{next}">
<label for="token">Dashboard token (${env})</label>
<input type="password" id="token" name="token" autocomplete="current-password" required autofocus>
<button type="submit">Log in</button>
</form></main></body></html>
"""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) names this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port; :class:`ValueError` naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--bind {text!r} must be HOST:PORT, e.g. 127.0.0.1:8000")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--bind {text!r}: the port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--bind {text!r}: the port must be 0..65535")
    return host.strip("[]") if host.startswith("[") else host, number


def _sign(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


class _Response:
    def __init__(
        self, status: int, body: bytes | str = b"", headers: dict[str, str] | None = None, mimetype: str = "text/html"
    ) -> None:
        self.status = status
        self.body = body.encode("utf-8") if isinstance(body, str) else body
        self.headers = {"Content-Type": f"{mimetype}; charset=utf-8", **security_headers(mimetype), **(headers or {})}
        self.cookies: list[str] = []


def _error(status: int, description: str) -> _Response:
    phrase = HTTPStatus(status).phrase
    body = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{status} {phrase}</title></head>'
        f"<body><h1>{status} {phrase}</h1><p>{html.escape(description)}</p></body></html>\n"
    )
    return _Response(status, body)


class DashboardApp:
    """The dashboard as a WSGI app on ``manager``: the pages of
    :mod:`~rainier_sync.dashboard.pages`, behind ``token`` (None: no login,
    and only requests to a loopback ``Host``)."""

    def __init__(self, manager: QueueManager, token: str | None) -> None:
        if token is not None and len(token) < MIN_TOKEN:
            raise ValueError(f"the dashboard token must be at least {MIN_TOKEN} characters, got {len(token)}")
        self.manager = manager
        self.token = token
        self._key = secrets.token_bytes(32)

    # -- sessions -------------------------------------------------------------------------------
    def _session(self, cookies: SimpleCookie) -> str | None:
        morsel = cookies.get(SESSION_COOKIE)
        if morsel is None:
            return None
        sid, _, rest = morsel.value.partition(".")
        expires, _, signature = rest.partition(".")
        if not hmac.compare_digest(signature.encode(), _sign(self._key, f"session:{sid}.{expires}").encode()):
            return None
        if not expires.isdigit() or int(expires) < time.time():
            return None
        return sid

    def _new_session(self, prefix: str) -> tuple[str, str]:
        sid = secrets.token_urlsafe(24)
        expires = str(int(time.time()) + SESSION_SECONDS)
        value = f"{sid}.{expires}.{_sign(self._key, f'session:{sid}.{expires}')}"
        return sid, self._cookie(SESSION_COOKIE, value, prefix, SESSION_SECONDS)

    @staticmethod
    def _cookie(name: str, value: str, prefix: str, max_age: int) -> str:
        return f"{name}={value}; Path={prefix or '/'}; Max-Age={max_age}; HttpOnly; SameSite=Strict"

    def _csrf(self, sid: str) -> str:
        return _sign(self._key, f"csrf:{sid}")

    # -- WSGI -------------------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            response = self._handle(environ)
        except Exception:
            logger.exception(
                "rainier_sync dashboard: %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO")
            )
            response = _error(500, "The page failed; the server's log has the traceback.")
        status = f"{response.status} {HTTPStatus(response.status).phrase}"
        headers = list(response.headers.items()) + [("Set-Cookie", cookie) for cookie in response.cookies]
        headers.append(("Content-Length", str(len(response.body))))
        start_response(status, headers)
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [response.body]

    def _handle(self, environ: dict[str, Any]) -> _Response:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        prefix = environ.get("SCRIPT_NAME", "").rstrip("/")
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace") or "/"
        if self.token is None and not self._loopback_host(environ):
            return _error(403, "Without a token the dashboard answers only requests to a loopback address.")
        if path.startswith("/static/"):
            return self._static(method, path.removeprefix("/static/"))
        cookies = SimpleCookie()
        try:
            cookies.load(environ.get("HTTP_COOKIE", ""))
        except CookieError:
            pass
        sid = self._session(cookies)
        args = {key: values[0] for key, values in parse_qs(environ.get("QUERY_STRING", "")).items()}
        if path == "/login":
            return self._login(environ, method, prefix, cookies, sid, args)
        minted = None
        if sid is None:
            if self.token is not None:
                if method in ("GET", "HEAD"):
                    here = prefix + path + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else "")
                    return _Response(303, headers={"Location": f"{prefix}/login?" + urlencode({"next": here})})
                return _error(401, f"Log in first: {prefix}/login.")
            sid, minted = self._new_session(prefix)
        response = self._page(environ, method, prefix, path, args, sid)
        if minted is not None:
            response.cookies.append(minted)
        return response

    def _page(
        self, environ: dict[str, Any], method: str, prefix: str, path: str, args: dict[str, str], sid: str
    ) -> _Response:
        found = match(path)
        if not found:
            return _error(404, "There is no dashboard page here.")
        wanted = "GET" if method == "HEAD" else method
        routed = [(route, values) for route, values in found if route.method == wanted]
        if not routed:
            allowed = {route.method for route, _ in found}
            if "GET" in allowed:
                allowed.add("HEAD")
            response = _error(405, f"{method} is not allowed here.")
            response.headers["Allow"] = ", ".join(sorted(allowed))
            return response
        route, values = routed[0]
        form: dict[str, str] = {}
        if method == "POST":
            read = self._form(environ)
            if isinstance(read, _Response):
                return read
            form = read
            sent = form.get("csrf_token") or environ.get("HTTP_X_CSRF_TOKEN", "")
            if not csrf_matches(sent, self._csrf(sid)):
                return _error(400, "The CSRF token is missing or does not match this session; reload the page.")
        request = PageRequest(
            endpoint=route.endpoint,
            values=values,
            args=args,
            form=form,
            url_for=lambda endpoint, **given: build_url(prefix, endpoint, given),
            csrf_token=lambda: self._csrf(sid),
        )
        try:
            page = build_page(self.manager, request)
        except PageError as exc:
            return _error(exc.status, exc.description)
        return _Response(page.status, page.body, headers=page.headers, mimetype=page.mimetype)

    @staticmethod
    def _form(environ: dict[str, Any]) -> dict[str, str] | _Response:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return _error(400, "Content-Length is not a number.")
        if length > MAX_FORM:
            return _error(413, f"A form of at most {MAX_FORM} bytes is read.")
        raw = environ["wsgi.input"].read(length) if length > 0 else b""
        text = raw.decode("utf-8", "replace")
        return {key: values[0] for key, values in parse_qs(text).items()}

    @staticmethod
    def _static(method: str, name: str) -> _Response:
        if method not in ("GET", "HEAD"):
            return _error(405, f"{method} is not allowed here.")
        data = static_file(name)
        if data is None:
            return _error(404, "No such file.")
        return _Response(200, data, mimetype="text/css" if name.endswith(".css") else "application/octet-stream")

    @staticmethod
    def _loopback_host(environ: dict[str, Any]) -> bool:
        host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name)

    # -- login ------------------------------------------------------------------------------------
    def _login(
        self,
        environ: dict[str, Any],
        method: str,
        prefix: str,
        cookies: SimpleCookie,
        sid: str | None,
        args: dict[str, str],
    ) -> _Response:
        index = f"{prefix}/"
        if self.token is None or sid is not None:
            return _Response(303, headers={"Location": index})
        if method in ("GET", "HEAD"):
            return self._login_form(prefix, cookies, args.get("next", ""), None)
        if method != "POST":
            return _error(405, f"{method} is not allowed here.")
        read = self._form(environ)
        if isinstance(read, _Response):
            return read
        nonce = cookies.get(LOGIN_COOKIE)
        expected = _sign(self._key, f"login:{nonce.value}") if nonce is not None and nonce.value else ""
        if not csrf_matches(read.get("csrf_token"), expected):
            return _error(400, "The CSRF token is missing or does not match this session; reload the page.")
        if not hmac.compare_digest(read.get("token", "").encode(), self.token.encode()):
            logger.warning("rainier_sync dashboard: a login with a wrong token from %s", environ.get("REMOTE_ADDR"))
            problem = "That is not the dashboard's token."
            return self._login_form(prefix, cookies, read.get("next", ""), problem, status=401)
        target = read.get("next", "")
        # Only a path of this dashboard: never another site (``//host``) or scheme.
        if not target.startswith(index) or target.startswith("//") or "\\" in target:
            target = index
        _, cookie = self._new_session(prefix)
        response = _Response(303, headers={"Location": target})
        response.cookies += [cookie, self._cookie(LOGIN_COOKIE, "", prefix, 0)]
        return response

    def _login_form(
        self, prefix: str, cookies: SimpleCookie, target: str, problem: str | None, status: int = 200
    ) -> _Response:
        # The nonce a form already on screen was made with is kept: the browser's other
        # requests (a favicon, a second tab) come back here too, and must not void it.
        held = cookies.get(LOGIN_COOKIE)
        nonce = held.value if held is not None and len(held.value) >= 32 else secrets.token_urlsafe(24)
        body = _LOGIN.format(
            css=html.escape(f"{prefix}/static/dashboard.css"),
            action=html.escape(f"{prefix}/login"),
            csrf=html.escape(_sign(self._key, f"login:{nonce}")),
            next=html.escape(target),
            env=TOKEN_ENV,
            problem=f'<p class="error" id="login-error">{html.escape(problem)}</p>' if problem else "",
        )
        response = _Response(status, body)
        response.cookies.append(self._cookie(LOGIN_COOKIE, nonce, prefix, 3600))
        return response


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.info("%s %s", self.address_string(), format % args)


def make_dashboard_server(app: DashboardApp, host: str, port: int) -> WSGIServer:
    """A threaded :mod:`wsgiref` server of ``app`` bound to ``host:port`` (port 0: any free one)."""
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    return make_server(host, port, app, server_class=server_class, handler_class=_Handler)
