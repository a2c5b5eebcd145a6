"""``rainier-sync --app`` pointed at a Flask app, as docs/flask.rst says: the
app object or its factory; the commands work on the manager of the app's
``RainierSync``, and ``queue:work`` runs each job inside an app context."""

from __future__ import annotations

import pytest

from rainier_sync.cli import main
from rainier_sync.flask import get_state

from . import cli_wsgi
from .apps import SEEN, RecordApp


@pytest.fixture(autouse=True)
def _no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """queue:work run in this process must not take pytest's SIGINT away."""
    monkeypatch.setattr("rainier_sync.worker.Worker.install_signal_handlers", lambda self: None)


def test_work_on_the_app_object_runs_its_jobs_in_an_app_context() -> None:
    manager = get_state(cli_wsgi.app).manager
    manager.dispatch(RecordApp("via rainier-sync"))
    assert main(["queue:work", "--once", "--app", "tests.flask.cli_wsgi:app"]) == 0
    assert [(seen["label"], seen["app"], seen["greeting"]) for seen in SEEN] == [
        ("via rainier-sync", "cli_wsgi", "hello from the app")
    ]


def test_the_factory_is_called_and_its_apps_manager_used(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--app", "tests.flask.cli_wsgi:create_app"]) == 0
    out = capsys.readouterr().out
    assert "ok: configuration: connections memory (memory); default memory\n" in out
    assert "ok: registry: " in out


def test_a_flask_app_without_the_extension_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:status", "--app", "tests.flask.cli_wsgi:bare_app"]) == 2
    assert capsys.readouterr().err == (
        "rainier-sync: error: --app tests.flask.cli_wsgi:bare_app is the Flask app 'no_queues', which has no "
        "rainier_sync extension: call RainierSync(app) (or init_app(app)) where the app is built\n"
    )
