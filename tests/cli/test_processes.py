"""The command line as a real process: ``python -m rainier_sync`` and the
``rainier-sync`` script, their exit codes, signals, logs and terminal output."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import wait_until

from .conftest import ROOT, run

APP = "--app=tests.cli.app:make_manager"


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def test_work_once_drains_and_exits_zero(out_file: Path) -> None:
    done = run("queue:work", "--once", APP, env={"CLI_APP_JOBS": "20", "CLI_APP_OUT": str(out_file)})
    assert done.returncode == 0, done.stderr
    assert sorted(lines(out_file)) == sorted(f"{n} ran" for n in range(20))
    assert "INFO rainier_sync: worker started: connection main (memory), queues default" in done.stderr
    assert "worker stopped: 20 processed, 0 released, 0 failed" in done.stderr


def test_work_quiet_logs_only_warnings(out_file: Path) -> None:
    done = run("queue:work", "--once", "--quiet", APP, env={"CLI_APP_JOBS": "2", "CLI_APP_OUT": str(out_file)})
    assert done.returncode == 0 and done.stderr == ""
    assert len(lines(out_file)) == 2


def test_work_max_jobs_stops_after_that_many(out_file: Path) -> None:
    done = run("queue:work", "--max-jobs=5", "--concurrency=1", APP,
               env={"CLI_APP_JOBS": "8", "CLI_APP_OUT": str(out_file)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(lines(out_file)) == 5


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_the_worker_gracefully(out_file: Path, signum: signal.Signals) -> None:
    env = {**os.environ, "CLI_APP_SLOW": "1", "CLI_APP_SLOW_SECONDS": "1.0", "CLI_APP_OUT": str(out_file)}
    env.pop("QUEUE_DRIVER", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "rainier_sync", "queue:work", "--sleep=0.1", APP],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: "0 started" in lines(out_file), timeout=30, message="the slow job to start")
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert lines(out_file) == ["0 started", "0 finished"]  # the running job was let finish
    assert f"signal {signum.name}: stopping after running jobs finish" in stderr
    assert "worker stopped: 1 processed" in stderr


def test_the_console_script_finds_an_app_in_the_working_directory() -> None:
    script = Path(sys.executable).with_name("rainier-sync")
    if not script.exists():
        pytest.skip(f"no rainier-sync script beside {sys.executable}: pip install -e . installs it")
    done = subprocess.run(
        [str(script), "queue:migrate", APP], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "main (memory): nothing to migrate\n"


def test_errors_are_one_line_without_a_traceback_unless_v() -> None:
    done = run("queue:status", "--app=tests.cli.broken_app:manager")
    assert done.returncode == 2
    assert done.stderr == (
        "rainier-sync: error: --app tests.cli.broken_app:manager: importing 'tests.cli.broken_app' failed: "
        "RuntimeError: the application's settings module is missing\n"
    )
    verbose = run("queue:status", "--app=tests.cli.broken_app:manager", "-v")
    assert verbose.returncode == 2 and "Traceback (most recent call last)" in verbose.stderr


def test_version() -> None:
    done = run("--version")
    assert done.returncode == 0 and done.stdout.startswith("rainier-sync ")


def test_retry_all_shows_progress_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("QUEUE_DRIVER", "RAINIER_APP")}
    env["CLI_APP_FAILED"] = "3000"
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "rainier_sync", "queue:retry", "all", APP],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
        os.close(follower)
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed its end
                break
            if not chunk:
                break
            seen += chunk
        stdout, _ = process.communicate(timeout=60)
    finally:
        os.close(leader)
    assert process.returncode == 0
    assert stdout == "Queued 3000 failed job(s) again.\n"
    assert b"\rRetrying: 3000/3000 (100%)" in seen


def test_make_job_writes_a_module_and_a_test_that_passes(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "rainier_sync", "make:job", "SendInvoice", "--queue=billing", "--prefix=billing"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    module = (tmp_path / "jobs" / "send_invoice.py").read_text()
    assert 'NAME = "billing.send-invoice"' in module and 'QUEUE = "billing"' in module
    assert (tmp_path / "jobs" / "__init__.py").exists()
    assert "from jobs.send_invoice import SendInvoice" in (tmp_path / "tests" / "test_send_invoice.py").read_text()
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_send_invoice.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "4 passed" in tested.stdout


def test_make_job_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    existing = tmp_path / "tests" / "test_send_invoice.py"
    existing.write_text("# mine\n")
    made = subprocess.run(
        [sys.executable, "-m", "rainier_sync", "make:job", "send_invoice"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 1
    assert made.stderr == "rainier-sync: error: tests/test_send_invoice.py already exists; not overwriting it\n"
    assert existing.read_text() == "# mine\n"
    assert not (tmp_path / "jobs").exists()  # nothing half-written


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["make:job", "send-invoice"], "'send-invoice' is not a job class name"),
        (["make:job", "Fine", "--path=../elsewhere"], "--path must be inside the current directory"),
    ],
)
def test_make_job_refuses_bad_names(tmp_path: Path, args: list[str], says: str) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "rainier_sync", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 2 and says in made.stderr and made.stderr.count("\n") == 1
    assert not (tmp_path / "jobs").exists()


def test_without_a_command_it_exits_2_with_the_help_on_stderr() -> None:
    done = run()
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: rainier-sync") and "queue:work" in done.stderr


@pytest.mark.parametrize("quiet", [[], ["--quiet"]], ids=["logging", "quiet"])
def test_work_once_fail_on_failed_says_how_many_failed_and_exits_1(out_file: Path, quiet: list[str]) -> None:
    env = {"CLI_APP_JOBS": "2", "CLI_APP_BROKEN": "1", "CLI_APP_OUT": str(out_file)}
    done = run("queue:work", "--once", "--fail-on-failed", *quiet, APP, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        " WARNING rainier_sync: worker stopped: 2 processed, 0 released, 1 failed; "
        "exit 1: 1 job(s) failed for good (--fail-on-failed)"
    )
    assert sorted(lines(out_file)) == ["0 ran", "1 ran"]
    without = run("queue:work", "--once", APP, env=env)
    assert without.returncode == 0, without.stderr
    assert without.stderr.splitlines()[-1].endswith(
        " INFO rainier_sync: worker stopped: 2 processed, 0 released, 1 failed"
    )
