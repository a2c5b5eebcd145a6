"""examples/flask_app: dispatch on a form submit within Flask-SQLAlchemy's
``db.session``, transactional with the signup, worked by an embedded thread or
by ``flask queue work`` in another process."""

from __future__ import annotations

import os
import pathlib
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from flask import Flask

from examples.flask_app import create_app
from examples.flask_app.jobs import Mailer, SendWelcome
from examples.flask_app.models import Signup, db
from rainier_sync.flask import get_state
from tests.support import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def app(tmp_path: pathlib.Path) -> Iterator[Flask]:
    app = create_app({"APP_DATABASE": str(tmp_path / "app.sqlite3"), "DASHBOARD_PASSWORD": "s3cret", "TESTING": True})
    yield app
    for worker in get_state(app).workers:
        worker.stop()
        worker.join(10)
    get_state(app).manager.close()


def rows(app: Flask, sql: str) -> list[Any]:
    with closing(sqlite3.connect(app.config["APP_DATABASE"])) as db:
        return db.execute(sql).fetchall()


def test_a_signup_queues_its_welcome_and_queue_work_sends_it(app: Flask, caplog: pytest.LogCaptureFixture) -> None:
    client = app.test_client()
    assert client.post("/signup", data={"name": "Ada", "email": "ada@example.com"}).status_code == 303
    assert "welcome queued" in client.get("/").get_data(as_text=True)
    assert get_state(app).manager.connection().size("mail") == 1

    result = app.test_cli_runner().invoke(args=["queue", "work", "--once", "--queue", "mail"])
    assert result.exit_code == 0, result.output
    assert "worker stopped: 1 processed, 0 released, 0 failed" in caplog.messages
    [(welcomed_at,)] = rows(app, "SELECT welcomed_at FROM signups")
    assert welcomed_at is not None
    assert get_state(app).manager.container.resolve(Mailer).sent == [("ada@example.com", "Welcome, Ada!")]


def test_bad_input_is_refused_and_nothing_is_queued(app: Flask) -> None:
    assert app.test_client().post("/signup", data={"name": "", "email": "nope"}).status_code == 400
    assert rows(app, "SELECT count(*) FROM signups") == [(0,)]
    assert get_state(app).manager.connection().size() == 0


def test_the_job_rolls_back_with_the_signup(app: Flask) -> None:
    """A request that fails after the dispatch: the app context's teardown
    removes db.session, rolling back the signup and its job together."""
    manager = get_state(app).manager
    with pytest.raises(RuntimeError, match="after the dispatch"), app.app_context():
        signup = Signup(name="Bob", email="bob@example.com")
        db.session.add(signup)
        db.session.flush()
        manager.pending(SendWelcome(signup_id=signup.id)).within(db.session).send()
        raise RuntimeError("the request failed after the dispatch")
    assert rows(app, "SELECT count(*) FROM signups") == [(0,)]
    assert manager.connection().size() == 0


def test_the_session_and_the_queue_share_one_database(app: Flask) -> None:
    assert app.config["DATABASE_URL"] == app.config["SQLALCHEMY_DATABASE_URI"]
    app.test_client().post("/signup", data={"name": "Ada", "email": "ada@example.com"})
    # One SQLite file holds the app's table and the queue's.
    assert rows(app, "SELECT count(*) FROM signups") == [(1,)]
    assert rows(app, "SELECT name FROM rainier_jobs") == [("signups.send-welcome",)]


def test_the_dashboard_needs_the_login(app: Flask) -> None:
    client = app.test_client()
    assert client.get("/queues/").status_code == 403
    assert client.post("/login", data={"password": "wrong"}).status_code == 403
    assert client.get("/queues/").status_code == 403
    assert client.post("/login", data={"password": "s3cret"}).status_code == 303
    client.post("/signup", data={"name": "Ada", "email": "ada@example.com"})
    page = client.get("/queues/").get_data(as_text=True)
    assert '<tr data-queue="mail">' in page
    assert "database <small>database" in page


def test_embedded_worker_for_development(tmp_path: pathlib.Path) -> None:
    app = create_app({"APP_DATABASE": str(tmp_path / "dev.sqlite3"), "EMBEDDED_WORKER": True, "TESTING": True})
    [worker] = get_state(app).workers
    try:
        app.test_client().post("/signup", data={"name": "Grace", "email": "grace@example.com"})
        wait_until(
            lambda: rows(app, "SELECT welcomed_at FROM signups")[0][0] is not None,
            timeout=10,
            message="the embedded worker to send the welcome",
        )
    finally:
        worker.stop()
        worker.join(10)
    assert worker.stats.processed == 1


def test_a_worker_in_another_process_for_production(app: Flask) -> None:
    app.test_client().post("/signup", data={"name": "Linus", "email": "linus@example.com"})
    # A production run: no debug, and a SECRET_KEY of its own (it refuses to start without one).
    env = {k: v for k, v in os.environ.items() if k != "FLASK_DEBUG"}
    env.update(APP_DATABASE=app.config["APP_DATABASE"], SECRET_KEY=secrets.token_hex(32))
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "examples.flask_app", "queue", "work", "--once", "--queue", "mail"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "1 processed" in done.stderr
    [(welcomed_at,)] = rows(app, "SELECT welcomed_at FROM signups")
    assert welcomed_at is not None
