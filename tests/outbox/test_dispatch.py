"""A dispatch ``.within(conn)`` to Redis, SQS or Kafka goes through the outbox
in the caller's transaction: a rollback leaves no job, a commit exactly one,
whether the caller holds a raw connection, a SQLAlchemy Connection or a
Session, on SQLite, PostgreSQL or MariaDB."""

from __future__ import annotations

import sqlite3
import urllib.parse
from contextlib import closing
from typing import Any

import pytest

from rainier_sync import QueueManager
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.outbox import Outbox, Relay

from .conftest import relay_all, sqlalchemy_url, take
from .jobs import Note, registry

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402


def raw_connection(url: str) -> Any:
    """The caller's own connection to the database at ``url``, not in autocommit mode."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "sqlite":
        return sqlite3.connect(parts.path[1:], timeout=10)
    if parts.scheme == "postgresql":
        import psycopg

        return psycopg.connect(url)
    import pymysql

    return pymysql.connect(
        host=parts.hostname, port=parts.port or 3306, user=parts.username or "root", database=parts.path[1:]
    )


def manager_over(target: BaseQueue, outbox_url: str, **options: Any) -> QueueManager:
    return QueueManager(
        connections={"fast": target}, registry=registry(), outbox=Outbox.from_url(outbox_url), **options
    )


def test_rollbacks_leave_no_job_and_commits_exactly_one(outbox_url: str, target: BaseQueue) -> None:
    manager = manager_over(target, outbox_url)
    outbox = manager.outbox
    assert outbox is not None
    kept: dict[str, str | None] = {}

    with closing(raw_connection(outbox_url)) as raw:
        manager.pending(Note("raw rolled back")).within(raw).send()
        raw.rollback()
        kept["raw kept"] = manager.pending(Note("raw kept")).within(raw).send()
        raw.commit()

    engine = create_engine(sqlalchemy_url(outbox_url))
    try:
        with engine.connect() as conn:
            manager.pending(Note("connection rolled back")).within(conn).send()
            conn.rollback()
            kept["connection kept"] = manager.pending(Note("connection kept")).within(conn).send()
            conn.commit()
        with Session(engine) as session:
            manager.pending(Note("session rolled back")).within(session).send()
            session.rollback()
            kept["session kept"] = manager.pending(Note("session kept")).within(session).send()
            session.commit()
    finally:
        engine.dispose()

    assert outbox.size() == 3, "committed jobs wait in the outbox until a relay publishes them"
    assert target.size("default") == 0 or target.kind == "kafka"
    relay = Relay(manager)
    assert relay.connections == ["fast"]
    relay_all(relay)
    jobs = take(target, 3)
    assert sorted(job.payload["text"] for job in jobs) == sorted(kept)
    assert {job.id for job in jobs} == set(kept.values())
    assert relay.stats.relayed == 3 and outbox.size() == 0
    manager.close()


def test_a_session_with_the_applications_own_writes(pg_outbox_url: str, redis_target: BaseQueue) -> None:
    """The order row and its job commit together, or neither does."""
    manager = manager_over(redis_target, pg_outbox_url)
    engine = create_engine(sqlalchemy_url(pg_outbox_url))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)"))
        conn.execute(text("DELETE FROM orders"))
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders (id) VALUES (1)"))
        manager.pending(Note("order 1")).within(session).send()
        session.commit()
        session.execute(text("INSERT INTO orders (id) VALUES (2)"))
        manager.pending(Note("order 2")).within(session).send()
        session.rollback()
        assert session.execute(text("SELECT count(*) FROM orders")).scalar() == 1
    engine.dispose()
    relay_all(Relay(manager))
    assert [job.payload["text"] for job in take(redis_target, 1)] == ["order 1"]
    manager.close()


def test_a_delayed_job_keeps_its_delay_through_the_outbox(sqlite_outbox_url: str, redis_target: BaseQueue) -> None:
    manager = manager_over(redis_target, sqlite_outbox_url)
    with closing(sqlite3.connect(sqlite_outbox_url.removeprefix("sqlite:///"))) as conn, conn:
        manager.pending(Note("later")).delay(3600).within(conn).send()
    relay_all(Relay(manager))
    assert redis_target.reserve(["default"]) is None
    assert redis_target.counts("default").delayed == 1
    manager.close()


def test_dispatch_many_within_a_transaction(pg_outbox_url: str, redis_target: BaseQueue) -> None:
    """A timeout child's batch of dispatches (send_queued with several jobs) goes in one transaction."""
    manager = manager_over(redis_target, pg_outbox_url)
    with closing(raw_connection(pg_outbox_url)) as conn:
        built = [manager.build(Note(f"n{i}"), connection="fast") for i in range(5)]
        ids = manager.send_queued("fast", built, within=conn)
        conn.commit()
    assert ids == [job.id for job in built]
    relay_all(Relay(manager))
    assert [job.payload["text"] for job in take(redis_target, 5)] == [f"n{i}" for i in range(5)]
    manager.close()
