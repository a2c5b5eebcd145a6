"""``rainier-sync dashboard``: the dashboard's pages served by wsgiref in a
subprocess, against real backends (SQLite, Redis), behind its token."""

from __future__ import annotations

import pathlib
import re
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from rainier_sync import Worker, WorkerOptions
from rainier_sync.drivers.base import BaseQueue

from .app import Explode, build, driver
from .support import TOKEN, Client, command, csrf, log_in, serving

HOSTILE = "<script>alert('owned')</script>"


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[tuple[BaseQueue, dict[str, str]]]:
    """A real backend, and the environment that points the served app at it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
        env = {"DASHBOARD_QUEUE_URL": url}
        queue = driver(url)
        yield queue, env
        queue.close()
    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"rsdash:{uuid.uuid4().hex[:12]}:"
        env = {"DASHBOARD_QUEUE_URL": url, "DASHBOARD_REDIS_PREFIX": prefix}
        queue = driver(url, prefix)
        yield queue, env
        client = queue.client  # type: ignore[attr-defined]
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        queue.close()


def failed_ids(page: str) -> list[str]:
    return re.findall(r'<tr class="failed-job" data-job-id="([^"]+)">', page)


@pytest.mark.timeout(120)
def test_the_standalone_dashboard_needs_its_token_and_csrf_and_retries_and_forgets(
    backend: tuple[BaseQueue, dict[str, str]], tmp_path: pathlib.Path
) -> None:
    queue, env = backend
    manager = build(queue)
    manager.dispatch(Explode(HOSTILE))
    manager.dispatch(Explode("two"))
    assert Worker(manager, options=WorkerOptions(queues=["mail"], once=True)).run().failed == 2

    with serving(tmp_path, env=env) as base:
        anonymous = Client(base)
        refused = anonymous.get("/")
        assert refused.status == 303 and refused.headers["Location"] == "/login?next=%2F"
        assert anonymous.get("/main/failed/x").status == 303
        assert anonymous.post("/main/failed/x/retry").status == 401
        assert anonymous.get("/workers").status == 303
        assert anonymous.get("/static/dashboard.css").status == 200, "the stylesheet, for the login page"

        client = Client(base)
        form = client.get("/login")
        assert form.status == 200 and "Content-Security-Policy" in form.headers
        wrong = client.post("/login", {"csrf_token": csrf(form.text), "token": "not-the-token-at-all", "next": "/"})
        assert wrong.status == 401 and "rainier_sync_session" not in client.cookies
        assert client.post("/login", {"token": TOKEN, "next": "/"}).status == 400, "the login needs its CSRF token"
        assert "rainier_sync_session" not in client.cookies
        log_in(client)

        index = client.get("/")
        assert index.status == 200
        policy = index.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "form-action 'self'" in policy and "script-src" not in policy
        assert index.headers["X-Content-Type-Options"] == "nosniff"
        assert HOSTILE not in index.text and "&lt;script&gt;alert(" in index.text
        ids = failed_ids(index.text)
        assert len(ids) == 2
        token = csrf(index.text)

        detail = client.get(f"/main/failed/{ids[0]}")
        assert detail.status == 200 and "tests.dashboard.explode" in detail.text
        assert "<script>alert(" not in detail.text
        for page in ("/workers", "/batches", "/main/queues/mail", "/main/queues/mail?state=delayed"):
            shown = client.get(page)
            assert shown.status == 200, page
            assert "default-src 'none'" in shown.headers["Content-Security-Policy"]
        assert client.get("/nowhere/at/all/here").status == 404
        assert client.get("/other/failed/x").status == 404
        css = client.get("/static/dashboard.css")
        assert css.status == 200 and css.headers["Content-Type"].startswith("text/css")

        assert client.post(f"/main/failed/{ids[0]}/retry").status == 400
        assert client.post(f"/main/failed/{ids[0]}/retry", {"csrf_token": "forged"}).status == 400
        assert (
            Client(base, dict(anonymous.cookies)).post(f"/main/failed/{ids[0]}/retry", {"csrf_token": token}).status
            == 401
        )
        assert queue.failed_count() == 2, "nothing refused was done"

        retried = client.post(f"/main/failed/{ids[0]}/retry", {"csrf_token": token})
        assert retried.status == 303
        assert retried.headers["Location"] == f"/?notice=retried&job={ids[0]}"
        assert queue.failed_count() == 1 and queue.counts("mail").ready == 1
        notice = client.get(retried.headers["Location"])
        assert f"Job {ids[0]} was queued again." in notice.text

        forgotten = client.post(f"/main/failed/{ids[1]}/forget", headers={"X-CSRF-Token": token})
        assert forgotten.status == 303 and "notice=forgotten" in forgotten.headers["Location"]
        assert queue.failed_count() == 0


@pytest.mark.timeout(60)
def test_a_session_from_another_server_is_not_accepted(tmp_path: pathlib.Path) -> None:
    """Sessions are signed with a key each server makes at start: a restart logs everyone out."""
    env = {"DASHBOARD_QUEUE_URL": f"sqlite:///{tmp_path / 'jobs.sqlite3'}"}
    with serving(tmp_path, env=env) as base:
        first = Client(base)
        log_in(first)
        assert first.get("/").status == 200
    with serving(tmp_path, env=env) as base:
        again = Client(base, dict(first.cookies))
        assert again.get("/").status == 303


@pytest.mark.timeout(60)
def test_no_auth_serves_loopback_hosts_only_and_still_checks_csrf(tmp_path: pathlib.Path) -> None:
    env = {"DASHBOARD_QUEUE_URL": f"sqlite:///{tmp_path / 'jobs.sqlite3'}"}
    with serving(tmp_path, "--no-auth", env=env, token=None) as base:
        client = Client(base)
        index = client.get("/")
        assert index.status == 200 and "rainier_sync_session" in client.cookies
        assert client.post("/main/retry-failed").status == 400
        done = client.post("/main/retry-failed", {"csrf_token": csrf(index.text)})
        assert done.status == 303 and done.headers["Location"] == "/?notice=retried-all&count=0"
        # A page fetched through a name that resolves here (DNS rebinding) is refused.
        assert Client(base).get("/", headers={"Host": "evil.example:80"}).status == 403


@pytest.mark.parametrize("bind", ["0.0.0.0:8000", "192.0.2.1:8000", "[::]:8000", "example.com:8000"])
def test_no_auth_off_loopback_is_refused(bind: str) -> None:
    argv, env = command("--no-auth", "--bind", bind, token=None)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--no-auth" in done.stderr and bind in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("token", "said"),
    [(None, "set RAINIER_DASHBOARD_TOKEN"), ("short", "RAINIER_DASHBOARD_TOKEN must be at least 16 characters")],
)
def test_no_token_is_refused(token: str | None, said: str) -> None:
    argv, env = command("--bind", "127.0.0.1:0", token=token)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert said in done.stderr, done.stderr


def test_a_bad_bind_is_refused() -> None:
    argv, env = command("--bind", "127.0.0.1", token=None)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--bind '127.0.0.1' must be HOST:PORT" in done.stderr, done.stderr


def test_the_default_bind_is_loopback() -> None:
    from rainier_sync.cli.parser import build_parser

    assert build_parser().parse_args(["dashboard"]).bind == "127.0.0.1:8000"
