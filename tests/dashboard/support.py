"""``rainier-sync dashboard`` in a subprocess, and a small HTTP client that keeps its cookies."""

from __future__ import annotations

import contextlib
import http.client
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKEN = "correct-horse-battery-staple-42"


def command(
    *args: str, env: Mapping[str, str] | None = None, token: str | None = TOKEN
) -> tuple[list[str], dict[str, str]]:
    environ = {key: value for key, value in os.environ.items() if key != "RAINIER_DASHBOARD_TOKEN"}
    environ["PYTHONPATH"] = str(ROOT)
    if token is not None:
        environ["RAINIER_DASHBOARD_TOKEN"] = token
    environ.update(env or {})
    return [sys.executable, "-m", "rainier_sync", "dashboard", *args], environ


@contextlib.contextmanager
def serving(
    tmp: pathlib.Path, *args: str, env: Mapping[str, str] | None = None, token: str | None = TOKEN
) -> Iterator[str]:
    """The dashboard served on a free loopback port; yields its base URL (no trailing slash).
    Stopped with SIGTERM at the end, which must exit it with 0."""
    argv, environ = command(
        "--app", "tests.dashboard.app:manager", "--bind", "127.0.0.1:0", *args, env=env, token=token
    )
    log = (tmp / "dashboard.log").open("w")
    process = subprocess.Popen(argv, env=environ, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        try:
            first = lines.get(timeout=60)
        except queue.Empty:
            raise AssertionError(f"the dashboard did not start: {(tmp / 'dashboard.log').read_text()}") from None
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
        assert found is not None, f"{first!r}; {(tmp / 'dashboard.log').read_text()}"
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        log.close()
    assert code == 0, f"exit {code}: {(tmp / 'dashboard.log').read_text()}"


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    text: str


@dataclass
class Client:
    """Requests to the server at ``base``, each on a new connection, with the cookies it set."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)

    def request(
        self, method: str, path: str, form: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None
    ) -> Reply:
        parts = urlsplit(self.base)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{key}={value}" for key, value in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            text = response.read().decode("utf-8")
        finally:
            connection.close()
        for cookie in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = cookie.partition("=")
            value = rest.split(";", 1)[0]
            if "Max-Age=0" in cookie:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return Reply(response.status, response.headers, text)

    def get(self, path: str, **kwargs: object) -> Reply:
        return self.request("GET", path, **kwargs)  # type: ignore[arg-type]

    def post(self, path: str, form: Mapping[str, str] | None = None, **kwargs: object) -> Reply:
        return self.request("POST", path, form=form or {}, **kwargs)  # type: ignore[arg-type]


def csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


def log_in(client: Client, token: str = TOKEN) -> None:
    form = client.get("/login")
    assert form.status == 200
    done = client.post("/login", {"csrf_token": csrf(form.text), "token": token, "next": "/"})
    assert done.status == 303 and done.headers["Location"] == "/", done.text
    (session,) = [c for c in done.headers.get_all("Set-Cookie") or [] if c.startswith("rainier_sync_session=")]
    assert "; HttpOnly" in session and "; SameSite=Strict" in session and "; Max-Age=43200" in session
