"""``rainier-sync check``: the pre-flight, run in this process through ``main()``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Schedule
from rainier_sync.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main
from rainier_sync.drivers import MemoryQueue
from rainier_sync.errors import SchemaMissingError
from rainier_sync.locks import MemoryLockStore
from rainier_sync.middleware import RateLimited

from . import app

APP = "--app=tests.cli.app:current_manager"


@dataclass
class LongJob(Job):
    NAME = "check-tests.long"
    TIMEOUT = 120

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Limited(Job):
    NAME = "check-tests.limited"

    def handle(self, context: JobContext) -> None:
        pass

    def middleware(self) -> list[Any]:
        return [RateLimited("mail", limit=10, per=60)]


class MissingTables(MemoryQueue):
    def counts(self, queue: str) -> Any:
        raise SchemaMissingError("the queue tables are missing from sqlite:///jobs.db")


class NoCoordinationTables(MemoryLockStore):
    def flags(self, group: str) -> set[str]:
        raise SchemaMissingError("the lock store's coordination tables are missing: run `rainier-sync queue:migrate`")


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_a_sound_app_passes_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    registry = JobRegistry().with_job(app.Touch).with_job(Limited)
    app.current = QueueManager(
        connections={"main": MemoryQueue(reservation=30)}, registry=registry, container=Container(),
        locks=MemoryLockStore(), schedule=Schedule().every(60, app.Touch(n=1), name="minutely"),
    )  # fmt: skip
    assert main(["check", APP]) == EXIT_OK
    found = lines(capsys)
    assert all(line.startswith("ok: ") for line in found), found
    assert "ok: configuration: connections main (memory); default main" in found
    assert "ok: registry: 2 job(s) registered" in found
    assert "ok: registry: jobs check-tests.limited keep state in the lock store" in found
    assert "ok: schedule: 1 entries, each job registered" in found
    assert "ok: lock store (MemoryLockStore): reachable, keeps flags" in found
    assert "ok: connection main (memory): reachable" in found


def test_rainier_app_names_the_app_too(
    memory: MemoryQueue, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAINIER_APP", "tests.cli.app:current_manager")
    assert main(["check"]) == EXIT_OK
    assert "ok: connection main (memory): reachable" in lines(capsys)


def test_each_problem_is_one_line_and_the_exit_is_2(capsys: pytest.CaptureFixture[str]) -> None:
    registry = JobRegistry().with_job(LongJob).with_job(Limited)
    app.current = QueueManager(
        connections={"main": MemoryQueue(reservation=60), "db": MissingTables(reservation=600)},
        default="main",
        registry=registry,
        locks=None,
    )
    assert main(["check", APP]) == EXIT_USAGE
    found = lines(capsys)
    problems = [line for line in found if line.startswith("problem: ")]
    assert len(problems) == 3, found
    timeout, store, tables = problems
    assert "job check-tests.long: TIMEOUT 120s exceeds the reservation of connection main (60s)" in timeout
    assert "e.g. 180" in timeout
    assert "jobs check-tests.limited keep state in a lock store (middleware, KEEP_RESULT)" in store
    assert "locks=" in store
    assert tables.startswith("problem: connection db (memory): the queue tables are missing")
    assert tables.endswith("run rainier-sync queue:migrate")
    assert "ok: connection main (memory): reachable" in found


def test_an_empty_registry_is_a_problem(capsys: pytest.CaptureFixture[str]) -> None:
    app.current = QueueManager(connections={"main": MemoryQueue()})
    assert main(["check", APP]) == EXIT_USAGE
    assert any(line.startswith("problem: registry: no job is registered") for line in lines(capsys))


def test_a_schedule_needs_a_lock_store_and_registered_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    schedule = Schedule().every(60, app.Touch(n=1), name="minutely")
    manager = app.current = QueueManager(
        connections={"main": MemoryQueue()}, registry=app.registry, schedule=schedule, locks=None
    )
    schedule.every(60, LongJob(), name="added-later")  # after the manager checked its entries
    assert main(["check", APP]) == EXIT_USAGE
    problems = [line for line in lines(capsys) if line.startswith("problem: ")]
    assert problems == [
        "problem: schedule entry 'added-later': job 'check-tests.long' is not registered",
        "problem: schedule: 2 entries but no lock store to dispatch each tick once across schedulers: give "
        "QueueManager locks= (a RedisLockStore or DatabaseLockStore every worker shares)",
    ]
    assert manager.schedule is schedule


def test_a_lock_store_without_coordination_tables_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    app.current = QueueManager(
        connections={"main": MemoryQueue()}, registry=app.registry, locks=NoCoordinationTables()
    )
    assert main(["check", APP]) == EXIT_USAGE
    (problem,) = [line for line in lines(capsys) if line.startswith("problem: ")]
    assert problem.startswith("problem: lock store (NoCoordinationTables) cannot keep flags")
    assert "queue:migrate" in problem


def test_unreachable_connections_are_problems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--app=tests.cli.app:unreachable"]) == EXIT_USAGE
    assert "problem: connection main (memory): cannot be reached: QueueUnavailableError: connection 'main' " \
        "(memory): could not reach the server at 127.0.0.1:1" in lines(capsys)  # fmt: skip


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("tests.cli.app:nothing_here", "module 'tests.cli.app' has no attribute 'nothing_here'"),
        ("tests.cli.app:explodes", "RuntimeError: could not reach the settings service"),
    ],
)
def test_an_app_that_does_not_build_is_a_configuration_problem(
    reference: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", f"--app={reference}"]) == EXIT_USAGE
    (line,) = lines(capsys)
    assert line.startswith("problem: configuration: ") and expected in line


def test_a_bad_environment_is_a_configuration_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUEUE_DRIVER", "nosuchdriver")
    assert main(["check"]) == EXIT_USAGE
    (line,) = lines(capsys)
    assert line.startswith("problem: configuration: ") and "nosuchdriver" in line


def test_queue_health_judges_the_files_age(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alive = tmp_path / "worker.alive"
    assert main(["queue:health", "--health-file", str(alive), "--max-age", "30"]) == EXIT_FAILURE
    assert capsys.readouterr().out == f"unhealthy: health file {alive} does not exist (no worker has touched it)\n"
    alive.touch()
    assert main(["queue:health", "--health-file", str(alive), "--max-age", "30"]) == EXIT_OK
    assert capsys.readouterr().out.startswith(f"healthy: health file {alive} was last touched 0.")
    old = time.time() - 45
    os.utime(alive, (old, old))
    assert main(["queue:health", "--health-file", str(alive), "--max-age", "30"]) == EXIT_FAILURE
    out = capsys.readouterr().out
    assert out.startswith(f"unhealthy: health file {alive} was last touched 45.") and "more than --max-age 30s" in out
    assert main(["queue:health", "--health-file", str(alive), "--max-age", "60"]) == EXIT_OK


def test_queue_health_needs_a_file_and_a_positive_age(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:health"]) == EXIT_USAGE
    assert "--health-file" in capsys.readouterr().err
    assert main(["queue:health", "--health-file", str(tmp_path / "f"), "--max-age", "0"]) == EXIT_USAGE
    assert "expected seconds > 0" in capsys.readouterr().err


def test_queue_work_health_file_is_touched_and_checked(
    memory: MemoryQueue, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alive = tmp_path / "worker.alive"
    assert main(["queue:work", "--once", "--health-file", str(alive), APP]) == EXIT_OK
    assert alive.exists()
    assert main(["queue:work", "--once", "--health-file", str(tmp_path / "no" / "f"), APP]) == EXIT_USAGE
    assert "health_file" in capsys.readouterr().err


@pytest.mark.parametrize("made", [True, False], ids=["schema-without-tables", "no-such-schema"])
def test_missing_tables_on_postgresql_name_the_schema_and_search_path_looked_in(
    postgres_url: str, capsys: pytest.CaptureFixture[str], made: bool
) -> None:
    import uuid

    import psycopg

    from rainier_sync.drivers.database import DatabaseQueue

    from ..drivers.database.support import with_search_path

    schema = f"rainier_check_{uuid.uuid4().hex[:8]}"
    if made:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    queue = DatabaseQueue.from_url(with_search_path(postgres_url, schema))
    try:
        app.current = QueueManager(connections={"db": queue}, registry=JobRegistry().with_job(app.Touch))
        assert main(["check", APP]) == EXIT_USAGE
    finally:
        queue.close()
        if made:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    [tables] = [line for line in lines(capsys) if line.startswith("problem: connection db")]
    if made:
        assert f'the queue tables are missing from schema "{schema}" (search_path {schema}) of the PostgreSQL' in tables
    else:
        assert f"its search_path ({schema}) names no schema that exists: create the schema" in tables
    assert "queue:migrate" in tables, tables
