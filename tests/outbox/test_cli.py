"""The outbox on the command line: ``outbox:refused`` lists the rows set aside,
``outbox:retry`` puts them back and ``outbox:forget`` gives one up;
``queue:status`` counts the backlog and ``check`` finds the rows set aside;
``flask queue relay`` relays."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from typing import Any

import pytest

from rainier_sync.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main
from rainier_sync.drivers.base import BaseQueue

from .relay_app import make_manager
from .test_processes import APP, app_env, dispatch_sqlite, redis_driver  # noqa: F401 - fixtures


@pytest.fixture
def outbox_env(sqlite_outbox_url: str, app_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:  # noqa: F811
    monkeypatch.setenv("OUTBOX_URL", sqlite_outbox_url)
    return sqlite_outbox_url


def set_aside(url: str, body: str) -> None:
    """A row the relay will set aside: one it cannot read."""
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
        conn.execute("INSERT INTO rainier_outbox (connection, body) VALUES ('fast', ?)", (body,))


def test_rows_set_aside_are_listed_put_back_and_forgotten(
    outbox_env: str, capsys: pytest.CaptureFixture[str], redis_driver: BaseQueue  # noqa: F811
) -> None:
    set_aside(outbox_env, "not json")
    dispatch_sqlite(outbox_env, ["good"])
    set_aside(outbox_env, "[]")
    assert main(["outbox:relay", "--once", APP]) == EXIT_OK
    assert redis_driver.size("default") == 1
    capsys.readouterr()

    assert main(["outbox:refused", APP]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["ROW", "CONNECTION", "QUEUE", "JOB", "ID", "WHY"]
    assert out.splitlines()[1].split()[:5] == ["1", "fast", "?", "?", "?"]
    assert "unreadable: a queued job is not valid JSON" in out
    assert "rainier-sync outbox:retry ROW|all puts them back" in out
    assert main(["outbox:refused", "--json", "--limit", "1", APP]) == EXIT_OK
    [row] = json.loads(capsys.readouterr().out)
    assert (row["seq"], row["connection"], row["job"]) == (1, "fast", {})

    assert main(["outbox:retry", "1", APP]) == EXIT_OK
    assert "Put 1 row(s) back in the outbox in the SQLite database" in capsys.readouterr().out
    assert main(["outbox:forget", "3", APP]) == EXIT_OK
    assert "Forgot row 3 of the outbox" in capsys.readouterr().out
    assert main(["outbox:forget", "3", APP]) == EXIT_FAILURE
    assert "no row 3 is set aside in the outbox (rainier-sync outbox:refused lists them)" in capsys.readouterr().err
    assert main(["outbox:retry", "first", APP]) == EXIT_USAGE
    assert "expected a row number" in capsys.readouterr().err
    assert main(["outbox:retry", "all", APP]) == EXIT_OK
    assert "Put 0 row(s) back" in capsys.readouterr().out, "row 1 is waiting again, not set aside"
    assert main(["outbox:relay", "--once", APP]) == EXIT_OK
    assert main(["outbox:refused", APP]) == EXIT_OK
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:2]] == ["1"], "set aside again"


def test_the_commands_without_an_outbox_are_bad_usage(
    app_env: dict[str, str], capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    for command in (["outbox:refused"], ["outbox:retry", "all"], ["outbox:forget", "1"]):
        assert main([*command, "--app=tests.outbox.relay_app:without_outbox"]) == EXIT_USAGE
        assert "the manager declares no outbox" in capsys.readouterr().err


def test_queue_status_counts_the_outbox_and_check_finds_rows_set_aside(
    outbox_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = outbox_env.removeprefix("sqlite:///")
    assert main(["check", APP]) == EXIT_OK
    assert f"ok: outbox ({path}): reachable, 0 job(s) waiting for the relay, none set aside" in capsys.readouterr().out
    set_aside(outbox_env, "not json")
    assert main(["outbox:relay", "--once", APP]) == EXIT_OK
    dispatch_sqlite(outbox_env, ["a", "b"])
    capsys.readouterr()

    assert main(["queue:status", APP]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"Outbox ({path}): 2 waiting for the relay (fast 2); 1 set aside (rainier-sync outbox:refused" in out
    assert main(["queue:status", "--json", APP]) == EXIT_OK
    [entry] = json.loads(capsys.readouterr().out)
    assert entry["outbox"] == {"waiting": 2, "refused": 1}

    assert main(["check", APP]) == EXIT_USAGE
    out = capsys.readouterr().out
    assert f"problem: outbox ({path}): 1 row(s) set aside, refused by their connection or unreadable" in out
    assert "rainier-sync outbox:refused lists them and why, rainier-sync outbox:retry puts them back" in out


def test_check_finds_an_outbox_without_its_table(
    tmp_path: Any, app_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("OUTBOX_URL", f"sqlite:///{tmp_path / 'new.db'}")
    assert main(["check", APP]) == EXIT_USAGE
    assert "the outbox table is missing" in capsys.readouterr().out


def test_flask_queue_relay(outbox_env: str, redis_driver: BaseQueue) -> None:  # noqa: F811
    from flask import Flask

    from rainier_sync.flask import RainierSync

    app = Flask("relaying")
    RainierSync(app, manager=make_manager())
    dispatch_sqlite(outbox_env, ["from flask"])
    result = app.test_cli_runner().invoke(args=["queue", "relay", "--once"])
    assert result.exit_code == 0, result.output
    [job] = redis_driver.reserve_many(["default"], 10)
    assert job.payload == {"text": "from flask"}
    redis_driver.acknowledge(job)
    help_text = app.test_cli_runner().invoke(args=["queue", "relay", "--help"]).output
    assert "--batch" in help_text

