"""The command line over the database driver (SQLite): the store outlives each
process, so a job dispatched here is migrated for, counted, worked, failed and
retried by separate ``python -m rainier_sync`` processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from rainier_sync import Container, QueueManager, QueueResources
from tests.support import free_port

from . import app
from .conftest import run

pytest.importorskip("rainier_sync.drivers.database", reason="the database driver is not installed")

APP = "--app=tests.cli.db_app:make_manager"


@pytest.fixture
def database(tmp_path: Path) -> dict[str, str]:
    return {"DATABASE_URL": f"sqlite:///{tmp_path / 'jobs.db'}", "CLI_APP_OUT": str(tmp_path / "jobs.log")}


@pytest.fixture
def manager(database: dict[str, str]) -> Iterator[QueueManager]:
    """A manager on the same SQLite file, in this process (after queue:migrate)."""
    migrated = run("queue:migrate", APP, env=database)
    assert migrated.returncode == 0, migrated.stderr
    built = QueueManager.from_config(
        {"connections": {"main": {"driver": "database"}}},
        resources=QueueResources(registry=app.registry, container=Container(), database=database["DATABASE_URL"]),
        environ={},
    )
    yield built
    built.close()


def test_migrate_applies_once_then_is_up_to_date(database: dict[str, str]) -> None:
    first = run("queue:migrate", APP, env=database)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("main (database): applied migration(s) 1")
    again = run("queue:migrate", APP, env=database)
    assert again.stdout == "main (database): already up to date\n"


def test_migrate_and_status_from_the_environment(database: dict[str, str]) -> None:
    env = {**database, "QUEUE_DRIVER": "database"}
    assert run("queue:migrate", env=env).returncode == 0
    status = run("queue:status", env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1].split()[:4] == ["database", "database", "(no", "jobs)"]


def test_status_counts_what_another_process_dispatched(manager: QueueManager, database: dict[str, str]) -> None:
    manager.dispatch(app.Touch(n=1))
    manager.dispatch(app.Touch(n=2))
    manager.dispatch_after(3600, app.Touch(n=3))
    status = run("queue:status", APP, env=database)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1].split() == ["main", "database", "default", "2", "1", "0", "3", "0"]


def test_work_failed_retry_forget_across_processes(manager: QueueManager, database: dict[str, str]) -> None:
    driver: Any = manager.connection()
    for n in range(3):
        manager.dispatch(app.Touch(n=n))
    broken = [manager.dispatch(app.Broken(n=n)) for n in range(2)]

    worked = run("queue:work", "--once", APP, env=database)
    assert worked.returncode == 0, worked.stderr
    assert "worker stopped: 3 processed, 0 released, 2 failed" in worked.stderr
    assert sorted(Path(database["CLI_APP_OUT"]).read_text().splitlines()) == ["0 ran", "1 ran", "2 ran"]

    failed = run("queue:failed", APP, env=database)
    rows = failed.stdout.splitlines()[1:]
    assert sorted(row.split()[0] for row in rows) == sorted(broken)  # type: ignore[type-var]
    assert all("RuntimeError: broken job" in row for row in rows)

    first, second = broken
    assert run("queue:forget", str(first), APP, env=database).returncode == 0
    retried = run("queue:retry", "all", APP, env=database)
    assert retried.stdout == "Queued 1 failed job(s) again.\n"
    assert driver.size("default") == 1 and driver.failed_jobs() == []
    assert run("queue:retry", str(second), APP, env=database).returncode == 1  # no longer failed


def test_a_command_other_than_migrate_never_creates_the_database_file(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    env = {"DATABASE_URL": f"sqlite:///{typo}", "CLI_APP_OUT": str(tmp_path / "jobs.log")}
    says = f"the SQLite database file {typo} does not exist: run DatabaseQueue.migrate() (or `rainier-sync queue:"
    for command in (["queue:status"], ["queue:failed"], ["queue:reclaim"], ["queue:work", "--once", "--give-up=1"]):
        done = run(*command, APP, env=env)
        assert says in done.stderr, (command, done.stderr)
        assert done.returncode == 2, (command, done.stderr)  # a configuration to fix: no waiting for it
        # queue:work logs that it started before the error line; every other command writes only the error.
        errors = [line for line in done.stderr.splitlines() if " INFO rainier_sync: " not in line]
        assert len(errors) == 1 and errors[0].startswith("rainier-sync: error: "), done.stderr
        assert not typo.exists(), f"{command} created {typo}"
    assert list(tmp_path.iterdir()) == [], "nothing at all was created beside it"
    migrated = run("queue:migrate", APP, env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert typo.exists()
    assert run("queue:status", APP, env=env).returncode == 0


def test_an_unreachable_postgresql_is_an_outage_not_a_usage_error(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: connections are refused
    env = {"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/test", "CLI_APP_OUT": str(tmp_path / "jobs.log")}
    done = run("queue:status", APP, env=env)
    assert done.returncode == 1, done.stderr
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/test" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
