"""``flask queue ...`` speaks as ``rainier-sync`` does, under its own name: the
same log lines, the same errors and exit codes, ``flask queue COMMAND`` where
``rainier-sync queue:COMMAND`` would be named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rainier_sync import QueueManager
from rainier_sync.drivers import MemoryQueue

from .conftest import ROOT, run

pytest.importorskip("flask", reason="the flask extra is not installed")

from tests.flask.apps import fail_jobs, make_app  # noqa: E402 - after the skip

FLASK_APP = "tests.cli.flask_app"
CLI_APP = "--app=tests.cli.app:make_manager"


def flask(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``flask --app tests.cli.flask_app *args`` from the repository root."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "RAINIER_", "FLASK_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", FLASK_APP, *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def normalised(stderr: str) -> list[str]:
    """Log lines without their timestamps and job ids, in a stable order."""
    text = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "<time> ", stderr, flags=re.M)
    return sorted(re.sub(r"\b[0-9a-f]{32}\b", "<id>", text).splitlines())


@pytest.mark.parametrize("options", [[], ["--fail-on-failed"]], ids=["plain", "fail-on-failed"])
def test_flask_queue_work_logs_as_rainier_sync_does(out_file: Path, options: list[str]) -> None:
    env = {"CLI_APP_JOBS": "2", "CLI_APP_BROKEN": "1", "CLI_APP_OUT": str(out_file)}
    argv = ["--once", "--concurrency=1", *options]
    mine = flask("queue", "work", *argv, env=env)
    theirs = run("queue:work", *argv, CLI_APP, env=env)
    assert mine.returncode == theirs.returncode == (1 if options else 0), mine.stderr
    assert mine.stdout == theirs.stdout == ""
    assert normalised(mine.stderr) == normalised(theirs.stderr)
    logged = mine.stderr.splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO rainier_sync: worker started: connection main \(memory\), "
        r"queues default, concurrency 1, once",
        logged[0],
    ), logged
    assert any(
        re.search(r" ERROR rainier_sync\S*: job [0-9a-f]{32} \(cli-tests.broken\) failed", line) for line in logged
    )
    assert "worker stopped: 2 processed, 0 released, 1 failed" in logged[-1]


def test_flask_queue_failed_as_json_and_in_full(out_file: Path) -> None:
    env = {"CLI_APP_FAILED": "1", "CLI_APP_OUT": str(out_file)}
    mine = flask("queue", "failed", "--json", env=env)
    theirs = run("queue:failed", "--json", CLI_APP, env=env)
    assert mine.returncode == theirs.returncode == 0, mine.stderr
    assert re.sub(r"[0-9a-f]{32}|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<x>", mine.stdout) == re.sub(
        r"[0-9a-f]{32}|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<x>", theirs.stdout
    )
    assert '"exception": {' in mine.stdout


def test_flask_queue_work_help_names_the_flask_command() -> None:
    done = flask("queue", "work", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: flask queue work [-h]")
    assert "--fail-on-failed" in done.stdout and "--app" not in done.stdout


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (
            ["work", "--concurency", "2"],
            2,
            "unrecognized option '--concurency'; did you mean '--concurrency'? (see flask queue work --help)",
        ),
        (
            ["work", "--concurrency", "0"],
            2,
            "argument --concurrency: expected a number >= 1, got 0 (see flask queue work --help)",
        ),  # fmt: skip
        (
            ["status", "--conection", "primary"],
            2,
            "unrecognized option '--conection'; did you mean '--connection'? (see flask queue status --help)",
        ),  # fmt: skip
        (["status", "--app", "elsewhere:manager"], 2, "unrecognized option '--app' (see flask queue status --help)"),
        (["status", "--connection", "nowhere"], 2, "connection 'nowhere' is not declared (declared: primary)"),
        (["failed", "nope"], 1, "no failed job has id 'nope' (flask queue failed lists them)"),
        (["retry", "nope"], 1, "no failed job has id 'nope' (flask queue failed lists them)"),
        (["forget", "nope"], 1, "no failed job has id 'nope' (flask queue failed lists them)"),
    ],
)
def test_flask_queue_errors_name_the_flask_command(args: list[str], code: int, says: str) -> None:
    app, manager = make_app()
    fail_jobs(manager, "one")
    result = app.test_cli_runner().invoke(args=["queue", *args])
    assert result.exit_code == code, result.output
    assert result.output == f"flask queue: error: {says}\n"


def test_flask_queue_work_errors_name_the_flask_command() -> None:
    app, _ = make_app(manager=QueueManager(connections={"m": MemoryQueue()}))
    result = app.test_cli_runner().invoke(args=["queue", "work", "--once"])
    assert result.exit_code == 2
    assert result.output == (
        "flask queue: error: the job registry is empty, so every job would fail as unknown: "
        "register the app's jobs (RainierSync(app, registry=...))\n"
    )


def test_a_misspelt_flask_queue_command_gets_a_did_you_mean() -> None:
    app, _ = make_app()
    result = app.test_cli_runner().invoke(args=["queue", "wrok"])
    assert result.exit_code == 2
    assert "No such command 'wrok'. Did you mean 'work'?" in result.output


# -- check, schedule-run, schedule-list ----------------------------------------------------------
RAINIER_APP = "--app=tests.cli.app:current_manager"


def _scheduled_manager() -> QueueManager:
    from rainier_sync import Container, Schedule
    from rainier_sync.locks import MemoryLockStore
    from tests.cli import app as cli_app

    schedule = Schedule().every(60, cli_app.Touch(n=1), name="minutely").cron("0 3 * * *", cli_app.Touch(n=2))
    return QueueManager(
        connections={"main": MemoryQueue()}, registry=cli_app.registry, container=Container(),
        locks=MemoryLockStore(), schedule=schedule,
    )  # fmt: skip


def _both(argv: list[str], flask_args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, Any]:
    """``flask queue *flask_args`` on one fresh scheduled manager, ``rainier-sync *argv`` on another:
    (exit code, output) of each, job ids masked."""
    from rainier_sync.cli import main
    from tests.cli import app as cli_app

    flask_app, _ = make_app(manager=_scheduled_manager())
    result = flask_app.test_cli_runner().invoke(args=["queue", *flask_args])
    cli_app.current = _scheduled_manager()
    code = main([*argv, RAINIER_APP])
    captured = capsys.readouterr()

    def masked(text: str) -> str:
        return re.sub(r"\b[0-9a-f]{32}\b", "<id>", text)

    return (result.exit_code, masked(result.output)), (code, masked(captured.out + captured.err))


def test_flask_queue_schedule_run_and_list_are_rainier_syncs(capsys: pytest.CaptureFixture[str]) -> None:
    from freezegun import freeze_time

    with freeze_time("2026-03-01 12:00:30"):
        mine, theirs = _both(["schedule:run"], ["schedule-run"], capsys)
        assert mine == theirs
        assert mine[0] == 0 and "dispatched minutely (tick 2026-03-01 12:00:00) as job <id>" in mine[1]
        assert "2 tick(s) dispatched; 2 entries in the schedule" in mine[1]
        mine, theirs = _both(["schedule:list"], ["schedule-list"], capsys)
        assert mine == theirs
        assert mine[0] == 0 and "minutely" in mine[1] and "2026-03-01 12:01:00" in mine[1]


def test_flask_queue_schedule_run_without_a_schedule_fails_as_rainier_sync_does() -> None:
    app, _ = make_app()
    result = app.test_cli_runner().invoke(args=["queue", "schedule-run"])
    assert result.exit_code == 2
    assert result.output.startswith("flask queue: error: ") and "no schedule" in result.output


def test_flask_queue_check_says_what_rainier_sync_check_says(capsys: pytest.CaptureFixture[str]) -> None:
    mine, theirs = _both(["check"], ["check"], capsys)
    assert mine == theirs
    assert mine[0] == 0 and "ok: configuration: connections main (memory); default main\n" in mine[1]
    assert "ok: schedule: 2 entries, each job registered\n" in mine[1]


def test_flask_queue_check_exits_2_naming_the_flask_fix() -> None:
    app, _ = make_app(manager=QueueManager(connections={"m": MemoryQueue()}))
    result = app.test_cli_runner().invoke(args=["queue", "check"])
    assert result.exit_code == 2
    assert (
        "problem: registry: no job is registered, so a worker would fail every job as unknown: "
        "register the app's jobs (RainierSync(app, registry=...))\n"
    ) in result.output


@pytest.mark.parametrize("command", ["check", "schedule-run", "schedule-list"])
def test_the_new_flask_queue_commands_name_themselves_in_help(command: str) -> None:
    app, _ = make_app()
    result = app.test_cli_runner().invoke(args=["queue", command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"usage: flask queue {command} [-h]")
    assert "--app" not in result.output


def test_rainier_sync_app_at_a_flask_factory_works_on_its_manager(out_file: Path) -> None:
    env = {"CLI_APP_FAILED": "2", "CLI_APP_OUT": str(out_file)}
    mine = flask("queue", "status", env=env)
    theirs = run("queue:status", f"--app={FLASK_APP}:create_app", env=env)
    assert mine.returncode == theirs.returncode == 0, theirs.stderr
    assert mine.stdout == theirs.stdout and "main" in theirs.stdout
