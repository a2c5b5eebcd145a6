"""Declaring the outbox (in Python and in configuration) and what is refused,
each error naming the thing at fault; the worker's relay."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rainier_sync import ConfigurationError, Job, JobContext, QueueManager, QueueResources, Worker, WorkerOptions
from rainier_sync.drivers import DatabaseQueue, MemoryQueue, SyncQueue
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.locks import MemoryLockStore
from rainier_sync.outbox import Outbox, Relay
from tests.support import wait_until

from .conftest import make_redis, sqlalchemy_url
from .jobs import Note, ran, registry
from .test_dispatch import manager_over


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


def sqlite_conn(url: str) -> sqlite3.Connection:
    return sqlite3.connect(url.removeprefix("sqlite:///"))


# -- refused at dispatch ---------------------------------------------------------------------------


def test_no_outbox_declared_is_refused_naming_the_connection(redis_target: BaseQueue, tmp_path: Path) -> None:
    manager = QueueManager(connections={"fast": redis_target}, registry=registry())
    with closing(sqlite3.connect(tmp_path / "app.db")) as conn, pytest.raises(ConfigurationError) as caught:
        manager.pending(Note("x")).within(conn).send()
    message = str(caught.value)
    assert "connection 'fast' (redis" in message and "declares no outbox" in message
    assert "Outbox.from_url" in message and "outbox = true" in message


def test_an_outbox_on_another_sqlite_file_is_refused_naming_both(
    sqlite_outbox_url: str, redis_target: BaseQueue, tmp_path: Path
) -> None:
    manager = manager_over(redis_target, sqlite_outbox_url)
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn, pytest.raises(TypeError) as caught:
        manager.pending(Note("x")).within(conn).send()
    message = str(caught.value)
    assert f"on the SQLite file {other}" in message
    assert f"not on the outbox's file {sqlite_outbox_url.removeprefix('sqlite:///')}" in message


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_an_outbox_on_another_database_of_the_server_is_refused_naming_both(
    request: pytest.FixtureRequest, dialect: str, redis_target: BaseQueue
) -> None:
    from sqlalchemy import create_engine

    url = str(request.getfixturevalue("pg_outbox_url" if dialect == "postgresql" else "my_outbox_url"))
    other = "postgres" if dialect == "postgresql" else "mysql"
    manager = manager_over(redis_target, url)
    base, _, _ = sqlalchemy_url(url).partition("?")
    engine = create_engine(base.rsplit("/", 1)[0] + f"/{other}")
    with engine.connect() as conn, pytest.raises(TypeError) as caught:
        manager.pending(Note("x")).within(conn).send()
    engine.dispose()
    message = str(caught.value)
    assert f"is connected to the database {other!r}" in message and "but the outbox is in the" in message
    assert "a SQLAlchemy Connection on" in message


def test_a_connection_of_another_dialect_is_refused_naming_both(
    pg_outbox_url: str, redis_target: BaseQueue, tmp_path: Path
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    manager = manager_over(redis_target, pg_outbox_url)
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with Session(engine) as session, pytest.raises(TypeError) as caught:
        manager.pending(Note("x")).within(session).send()
    engine.dispose()
    message = str(caught.value)
    assert "needs an open postgresql connection to the outbox's database (127.0.0.1:5432/test)" in message
    assert "got a SQLAlchemy Session on sqlite+pysqlite" in message


def test_what_is_not_a_connection_is_refused(sqlite_outbox_url: str, redis_target: BaseQueue) -> None:
    from sqlalchemy import create_engine

    manager = manager_over(redis_target, sqlite_outbox_url)
    with pytest.raises(TypeError, match="needs an open sqlite connection to the outbox's database .*got builtins.obj"):
        manager.pending(Note("x")).within(object()).send()
    engine = create_engine(sqlalchemy_url(sqlite_outbox_url))
    with pytest.raises(TypeError, match="takes a SQLAlchemy Connection or Session, got Engine"):
        manager.pending(Note("x")).within(engine).send()
    engine.dispose()
    assert manager.outbox is not None and manager.outbox.size() == 0


def test_a_connection_the_outbox_does_not_take_is_refused(
    sqlite_outbox_url: str, redis_target: BaseQueue, redis_url: str
) -> None:
    other = make_redis(redis_url)
    manager = QueueManager(
        connections={"fast": redis_target, "other": other}, default="fast", registry=registry(),
        outbox=Outbox.from_url(sqlite_outbox_url, connections=["other"]),
    )  # fmt: skip
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, pytest.raises(ConfigurationError) as caught:
        manager.pending(Note("x")).within(conn).send()
    assert "connection 'fast' (redis" in str(caught.value) and "(it takes: other)" in str(caught.value)
    other.close()


def test_a_connection_that_keeps_its_jobs_in_memory_cannot_take_them_through_the_outbox(
    sqlite_outbox_url: str,
) -> None:
    """A relay in another process would publish them into its own memory."""
    manager = QueueManager(connections={"mem": MemoryQueue()}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, pytest.raises(ConfigurationError) as caught:
        manager.pending(Note("x")).within(conn).send()
    assert "connection 'mem' (memory) keeps its jobs in this process's memory" in str(caught.value)
    assert manager.outbox is not None and manager.outbox.size() == 0
    with pytest.raises(ConfigurationError, match="the outbox relay has no connection to publish to"):
        Relay(manager)


def test_the_sync_driver_cannot_dispatch_within_a_transaction(sqlite_outbox_url: str) -> None:
    manager = QueueManager(connections={"now": SyncQueue()}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, pytest.raises(TypeError, match="'now' \\(sync\\) runs a job"):
        manager.pending(Note("x")).within(conn).send()


@dataclass
class Kept(Job):
    NAME = "outbox.kept"
    KEEP_RESULT = 60.0

    n: int

    def handle(self, context: JobContext) -> int:
        return self.n


def test_a_job_keeping_its_result_without_a_lock_store_is_refused_before_it_is_written(
    sqlite_outbox_url: str, redis_target: BaseQueue
) -> None:
    manager = manager_over(redis_target, sqlite_outbox_url, locks=None)
    manager.registry.register(Kept)
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, pytest.raises(ConfigurationError, match="KEEP_RESULT"):
        manager.pending(Kept(1)).within(conn).send()
    assert manager.outbox is not None and manager.outbox.size() == 0


def test_a_kept_result_is_pending_once_relayed_and_then_its_value(
    sqlite_outbox_url: str, redis_target: BaseQueue
) -> None:
    manager = manager_over(redis_target, sqlite_outbox_url, locks=MemoryLockStore())
    manager.registry.register(Kept)
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, conn:
        job_id = manager.pending(Kept(7)).within(conn).send()
    assert job_id is not None
    assert manager.result(job_id).status == "unknown", "not relayed yet: it may still be rolled back"
    Relay(manager).run_once()
    assert manager.result(job_id).status == "pending"
    Worker(manager, options=WorkerOptions(once=True)).run()
    assert (manager.result(job_id).status, manager.result(job_id).value) == ("processed", 7)


# -- refused at boot -------------------------------------------------------------------------------


def test_an_outbox_naming_what_is_not_for_it_is_refused_at_boot(sqlite_outbox_url: str, tmp_path: Path) -> None:
    database = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'jobs.db'}")
    with pytest.raises(ConfigurationError, match=r"names connection 'nope', which is not declared \(declared: mem\)"):
        QueueManager(connections={"mem": MemoryQueue()}, outbox=Outbox(sqlite_outbox_url, connections=["nope"]))
    with pytest.raises(ConfigurationError, match="writes a job in the caller's transaction itself"):
        QueueManager(connections={"db": database}, outbox=Outbox(sqlite_outbox_url, connections=["db"]))
    with pytest.raises(ConfigurationError, match="'now' \\(sync\\), which runs a job inside dispatch"):
        QueueManager(connections={"now": SyncQueue()}, outbox=Outbox(sqlite_outbox_url, connections=["now"]))
    with pytest.raises(ConfigurationError, match="'mem' \\(memory\\), whose jobs live in one process's memory"):
        QueueManager(connections={"mem": MemoryQueue()}, outbox=Outbox(sqlite_outbox_url, connections=["mem"]))
    database.close()


def test_a_relay_with_no_connection_to_publish_to_fails_at_boot(sqlite_outbox_url: str, tmp_path: Path) -> None:
    database = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'jobs.db'}")
    for connections in ({}, {"db": database}):
        manager = QueueManager(connections=connections, registry=registry(), outbox=Outbox(sqlite_outbox_url))
        with pytest.raises(ConfigurationError) as caught:
            Relay(manager)
        message = str(caught.value)
        assert "the outbox relay has no connection to publish to" in message
        assert f"declared: {'db (database)' if connections else 'none'}" in message
    with pytest.raises(ConfigurationError, match="no connection to publish to"):
        Worker(manager, options=WorkerOptions(relay=True))  # a worker of the database connection
    database.close()


def test_an_outbox_url_that_is_not_a_database_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="scheme 'redis' is not supported"):
        Outbox.from_url("redis://127.0.0.1:6379/0")
    for lease in (0, -1, True, "30"):
        with pytest.raises(ConfigurationError, match=f"lease must be a positive number of seconds, got {lease!r}"):
            Outbox.from_url("sqlite:///x.db", lease=lease)


def test_a_relay_needs_an_outbox(redis_target: BaseQueue) -> None:
    manager = QueueManager(connections={"fast": redis_target}, registry=registry())
    with pytest.raises(ConfigurationError, match="declares no outbox, so there is nothing to relay"):
        Relay(manager)
    with pytest.raises(ConfigurationError, match="declares no outbox"):
        Worker(manager, options=WorkerOptions(relay=True))
    with pytest.raises(ConfigurationError, match="relay must be True or False"):
        WorkerOptions(relay="yes")  # type: ignore[arg-type]


# -- configuration ---------------------------------------------------------------------------------


def _section(redis_url: str, **extra: Any) -> dict[str, Any]:
    return {"connections": {"fast": {"driver": "redis", "url": redis_url, "prefix": "rsoutbox:cfg:", **extra}}}


def test_outbox_true_on_a_connection_puts_its_dispatches_in_the_applications_database(
    redis_url: str, sqlite_outbox_url: str
) -> None:
    manager = QueueManager.from_config(
        _section(redis_url, outbox=True), registry=registry(), resources=QueueResources(database=sqlite_outbox_url)
    )
    try:
        outbox = manager.outbox
        assert outbox is not None and outbox.connections == {"fast"} and outbox.target.path.endswith("app.db")
        with closing(sqlite_conn(sqlite_outbox_url)) as conn, conn:
            manager.pending(Note("configured")).within(conn).send()
        assert outbox.size("fast") == 1
        assert Relay(manager).run_once() == 1
        [job] = manager.connection().reserve_many(["default"], 10)
        assert job.payload == {"text": "configured"}
        manager.connection().acknowledge(job)
    finally:
        manager.close()


def test_outbox_true_without_the_applications_database_fails_at_boot(redis_url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_config(_section(redis_url, outbox=True), registry=registry(), environ={})
    message = str(caught.value)
    assert "connection 'fast' (redis): outbox = true" in message
    assert "DATABASE_URL is not set (nor QueueResources.database)" in message


def test_outbox_settings_refused_by_name(redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="outbox must be true or false"):
        Connections_from(_section(redis_url, outbox="maybe"))
    with pytest.raises(ConfigurationError, match=r"unknown setting 'outbx'.*did you mean 'outbox'"):
        Connections_from(_section(redis_url, outbx=True))
    with pytest.raises(ConfigurationError) as caught:
        Connections_from({"connections": {"db": {"driver": "database", "outbox": True}}})
    assert "'outbox' cannot be honoured: the database driver writes a job within the caller's transaction" in str(
        caught.value
    )


def Connections_from(section: dict[str, Any]) -> Any:  # noqa: N802 - reads as the call it makes
    from rainier_sync import Connections

    return Connections.from_dict(section)


def test_queue_outbox_in_the_environment(redis_url: str, sqlite_outbox_url: str) -> None:
    environ = {
        "QUEUE_DRIVER": "redis",
        "REDIS_URL": redis_url,
        "REDIS_QUEUE_PREFIX": "rsoutbox:env:",
        "QUEUE_OUTBOX": "true",
        "DATABASE_URL": sqlite_outbox_url,
    }
    manager = QueueManager.from_env(registry=registry(), environ=environ)
    assert manager.outbox is not None and manager.outbox.connections == {"redis"}
    manager.close()


# -- the worker's relay -----------------------------------------------------------------------------


def test_a_once_worker_relays_before_it_claims(sqlite_outbox_url: str, redis_target: BaseQueue) -> None:
    manager = manager_over(redis_target, sqlite_outbox_url)
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, conn:
        manager.pending(Note("relayed then run")).within(conn).send()
    stats = Worker(manager, options=WorkerOptions(once=True, relay=True)).run()
    assert stats.processed == 1 and ran == ["relayed then run"]
    manager.close()


def test_a_once_worker_whose_relay_fails_names_the_outbox_and_works_on(
    sqlite_outbox_url: str, redis_target: BaseQueue, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from rainier_sync.drivers import RedisQueue
    from tests.support import free_port

    down = RedisQueue.from_url(f"redis://127.0.0.1:{free_port()}/0", connect_timeout_ms=200, response_timeout_ms=200)
    manager = QueueManager(
        connections={"fast": redis_target, "down": down}, default="fast", registry=registry(),
        outbox=Outbox.from_url(sqlite_outbox_url),
    )  # fmt: skip
    with closing(sqlite_conn(sqlite_outbox_url)) as conn, conn:
        manager.pending(Note("stays")).on_connection("down").within(conn).send()
        manager.pending(Note("runs")).within(conn).send()
    with caplog.at_level(logging.WARNING, "rainier_sync"):
        stats = Worker(manager, options=WorkerOptions(once=True, relay=True)).run()
    assert stats.processed == 1 and ran == ["runs"]
    [line] = [m for m in caplog.messages if "did not relay everything" in m]
    assert line.startswith(f"the outbox relay (the outbox in the SQLite database {sqlite_outbox_url[10:]})")
    assert "connection 'down' (redis" in line and "did not take 1 job(s) (outbox row 1 (job " in line
    assert not any("queue operation relay on connection" in m for m in caplog.messages)
    manager.close()


def test_a_worker_runs_the_relay_beside_its_loop_and_stops_it(pg_outbox_url: str, redis_target: BaseQueue) -> None:
    from .test_dispatch import raw_connection

    manager = manager_over(redis_target, pg_outbox_url)
    worker = Worker(manager, options=WorkerOptions(relay=True, sleep=5, concurrency=2))
    assert worker._relay is not None
    worker.start()
    try:
        with closing(raw_connection(pg_outbox_url)) as conn:
            manager.pending(Note("while it works")).within(conn).send()
            conn.commit()
        wait_until(lambda: ran == ["while it works"], timeout=10, message="the relayed job to run")
    finally:
        worker.stop()
        worker.join(15)
    assert worker._relay.join(0) and worker._relay.stats.relayed == 1
    manager.close()
