"""``queue:work`` started before its backend: it waits for it the way it rides
out an outage later on, and works once it answers; a ``--once`` run waits up to
``--give-up`` seconds and then exits 1 saying why. A backend that answers and
refuses the configuration still ends the command at once with exit 2."""

from __future__ import annotations

import pathlib
import signal
import time
import urllib.parse
from typing import Iterator

import pytest

from rainier_sync import Container, QueueManager
from tests.support import free_port

from . import app
from .conftest import run
from .late import Forwarder, WorkerProcess, redis_server

FROM_ENV = "--app=tests.cli.app:from_env"


def _failed_attempt(line: str) -> bool:
    return "queue operation" in line and "failed" in line


def _redis_manager(port: int) -> QueueManager:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    from rainier_sync.drivers.redis import RedisQueue

    return QueueManager({"main": RedisQueue.from_url(f"redis://127.0.0.1:{port}/0")}, "main", app.registry, Container())


@pytest.fixture
def out_file(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "jobs.log"


# -- Redis ---------------------------------------------------------------------------------------
def test_a_resident_worker_waits_for_redis_to_come_up_then_works(
    tmp_path: pathlib.Path, out_file: pathlib.Path
) -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    port = free_port()
    env = {"QUEUE_DRIVER": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0", "CLI_APP_OUT": str(out_file)}
    worker = WorkerProcess("--max-jobs=1", "--sleep=0.2", FROM_ENV, env=env)
    server = None
    try:
        worker.wait_for_line(_failed_attempt)  # it started, found nothing listening, and is still running
        assert worker.proc.poll() is None, worker.stderr
        server = redis_server(tmp_path / "redis", port)
        manager = _redis_manager(port)
        manager.dispatch(app.Touch(n=7))
        manager.close()
        assert worker.wait() == 0, worker.stderr
    finally:
        worker.close()
        if server is not None:
            server.stop()
    assert out_file.read_text().splitlines() == ["7 ran"]
    assert "worker stopped: 1 processed" in worker.stderr


def test_a_once_run_waits_for_redis_at_start_up(tmp_path: pathlib.Path, out_file: pathlib.Path) -> None:
    redis = pytest.importorskip("redis", reason="the redis extra is not installed")
    port = free_port()
    directory = tmp_path / "redis"
    # The job is stored first, in the dump file of a server on that port, then the server stops:
    # the worker starts with nothing listening, and the server it then meets loads the job.
    first = redis_server(directory, port)
    try:
        manager = _redis_manager(port)
        manager.dispatch(app.Touch(n=3))
        manager.close()
        try:
            redis.Redis(host="127.0.0.1", port=port).shutdown(save=True)
        except redis.ConnectionError:
            pass  # the server closed the connection as it shut down
        assert first.proc.wait(10) == 0
    finally:
        first.stop()
    assert (directory / f"dump-{port}.rdb").exists()
    env = {"QUEUE_DRIVER": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0", "CLI_APP_OUT": str(out_file)}
    worker = WorkerProcess("--once", "--give-up=120", FROM_ENV, env=env)
    server = None
    try:
        worker.wait_for_line(_failed_attempt)
        server = redis_server(directory, port)
        assert worker.wait() == 0, worker.stderr
    finally:
        worker.close()
        if server is not None:
            server.stop()
    assert out_file.read_text().splitlines() == ["3 ran"]


def test_a_once_run_gives_up_on_redis_that_never_comes_up_after_give_up() -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    port = free_port()
    began = time.monotonic()
    done = run(
        "queue:work", "--once", "--give-up=3", FROM_ENV,
        env={"QUEUE_DRIVER": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0"}, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr
    assert took >= 2, f"exited after {took:.1f}s, without waiting for the server"
    last = done.stderr.splitlines()[-1]
    assert last.startswith("rainier-sync: error: ") and "giving up this --once run" in last
    assert "start" in last and f"127.0.0.1:{port}" in last


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:{port}/99", "redis://:not-the-password@127.0.0.1:{port}/0"],
    ids=["db-index-out-of-range", "auth-refused"],
)
def test_redis_refusing_the_configuration_fails_at_once_with_exit_2(url: str, redis_url: str) -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    port = urllib.parse.urlsplit(redis_url).port or 6379
    for command in (["--once", "--give-up=60"], ["--sleep=0.2"]):
        done = run("queue:work", *command, FROM_ENV, env={"QUEUE_DRIVER": "redis", "REDIS_URL": url.format(port=port)},
                   timeout=60)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[-1].startswith("rainier-sync: error: ")


# -- PostgreSQL ------------------------------------------------------------------------------------
@pytest.fixture
def postgres(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated PostgreSQL schema of this session's (its URL)."""
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    from tests.drivers.database.support import postgres_schema_url

    yield postgres_schema_url(request)


def _on_port(url: str, port: int) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{port}"))


def _db_manager(url: str) -> QueueManager:
    from rainier_sync.drivers.database import DatabaseQueue

    return QueueManager({"main": DatabaseQueue.from_url(url)}, "main", app.registry, Container())


@pytest.mark.parametrize(
    "mode", [["--once", "--give-up=120"], ["--max-jobs=1", "--sleep=0.2"]], ids=["once", "resident"]
)
def test_a_worker_waits_for_postgres_to_come_up_then_works(
    mode: list[str], postgres: str, out_file: pathlib.Path
) -> None:
    manager = _db_manager(postgres)
    job_id = manager.dispatch_on("startup", app.Touch(n=5))
    manager.close()
    port = free_port()
    real = urllib.parse.urlsplit(postgres)
    env = {"DATABASE_URL": _on_port(postgres, port), "CLI_APP_OUT": str(out_file)}
    worker = WorkerProcess(*mode, "--queue=startup", "--app=tests.cli.db_app:make_manager", env=env)
    forwarder = None
    try:
        # The driver connects as it is built: it is the manager's boot that is tried again.
        assert "queue operation boot on the default connection" in worker.wait_for_line(_failed_attempt)
        assert worker.proc.poll() is None, worker.stderr
        forwarder = Forwarder(port, (real.hostname or "127.0.0.1", real.port or 5432))
        assert worker.wait() == 0, worker.stderr
    finally:
        worker.close()
        if forwarder is not None:
            forwarder.close()
    assert out_file.read_text().splitlines() == ["5 ran"], job_id


def test_a_once_run_gives_up_on_postgres_that_never_comes_up_after_give_up(postgres: str) -> None:
    port = free_port()
    began = time.monotonic()
    done = run("queue:work", "--once", "--give-up=3", "--app=tests.cli.db_app:make_manager",
               env={"DATABASE_URL": _on_port(postgres, port)}, timeout=120)  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 1, done.stderr
    assert took >= 2, f"exited after {took:.1f}s, without waiting for the server"
    last = done.stderr.splitlines()[-1]
    assert last.startswith("rainier-sync: error: ") and "giving up this --once run" in last
    assert f"127.0.0.1:{port}" in last


@pytest.mark.parametrize("server", ["postgres", "mysql_url"])
def test_a_database_refusing_the_database_name_fails_at_once_with_exit_2(
    server: str, request: pytest.FixtureRequest
) -> None:
    base = request.getfixturevalue(server)
    pytest.importorskip("psycopg" if server == "postgres" else "pymysql", reason="the database extra is not installed")
    parts = urllib.parse.urlsplit(base)
    url = urllib.parse.urlunsplit(parts._replace(path="/rainier_no_such_database"))
    done = run("queue:work", "--once", "--give-up=60", "--app=tests.cli.db_app:make_manager",
               env={"DATABASE_URL": url}, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "rainier_no_such_database" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_sigterm_while_waiting_for_the_backend_stops_the_worker_with_exit_0(
    backend: str, request: pytest.FixtureRequest
) -> None:
    port = free_port()
    if backend == "redis":
        pytest.importorskip("redis", reason="the redis extra is not installed")
        # Redis connects at the first command: the worker's own start-up waits.
        env = {"QUEUE_DRIVER": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        args, operation = [FROM_ENV], "start"
    else:
        # The database driver connects as it is built: the command's boot waits.
        url = _on_port(request.getfixturevalue("postgres"), port)
        args, env, operation = ["--app=tests.cli.db_app:make_manager"], {"DATABASE_URL": url}, "boot"
    worker = WorkerProcess("--sleep=0.2", *args, env=env)
    try:
        assert f"queue operation {operation} on" in worker.wait_for_line(_failed_attempt)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.stderr
    finally:
        worker.close()
