"""Dispatch within the caller's transaction, on each dialect: a unique job's
lock is taken in that transaction when the lock store is in the same
database, so a rollback leaves no lock behind; and a connection in autocommit
mode, whose writes would commit at once, is refused unless it is inside a
transaction it began."""

from __future__ import annotations

import sqlite3
import threading
import urllib.parse
from contextlib import closing
from typing import Any

import pytest

from rainier_sync import JobRegistry, QueueManager
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.locks import MemoryLockStore

from .test_driver import Hello, Once, make_manager, once, ran


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


def connect(url: str, *, autocommit: bool = False) -> Any:
    """The caller's own DBAPI connection to ``url``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "sqlite":
        return sqlite3.connect(parts.path[1:], timeout=10, isolation_level=None if autocommit else "")
    if parts.scheme == "postgresql":
        import psycopg

        return psycopg.connect(url, autocommit=autocommit)
    import pymysql

    return pymysql.connect(
        host=parts.hostname, port=parts.port or 3306, user=parts.username or "root", database=parts.path[1:],
        autocommit=autocommit,
    )  # fmt: skip


def begin(conn: Any) -> None:
    """Begin a transaction on a connection in autocommit mode, as each client does."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN")
    elif type(conn).__module__.startswith("psycopg"):
        conn.execute("BEGIN")
    else:
        conn.begin()


def send(manager: QueueManager, conn: Any, key: str, *, commit: bool) -> str | None:
    sent = manager.pending(Once(key)).within(conn).send()
    conn.commit() if commit else conn.rollback()
    return sent


# -- unique jobs ---------------------------------------------------------------------------------


def test_a_rolled_back_unique_dispatch_leaves_no_lock(db_url: str) -> None:
    """The lock store is the queue's database: the lock is written in the caller's
    transaction, and goes with it."""
    manager = make_manager(db_url)
    assert manager.locks is not None
    with closing(connect(db_url)) as conn:
        assert send(manager, conn, "a", commit=False) is not None
        assert manager.locks.owner("dbtest.once:a") is None, "rolled back with the job"
        first = send(manager, conn, "a", commit=True)
        assert first is not None, "not dropped as the duplicate of a job that was rolled back"
        assert manager.locks.owner("dbtest.once:a") is not None
        assert send(manager, conn, "a", commit=True) is None, "its lock is held: a duplicate"
    assert manager.dispatch(Once("a")) is None, "and outside a transaction too"
    assert manager.connection().size() == 1
    assert once(manager).processed == 1 and ran == ["a"]
    with closing(connect(db_url)) as conn:
        assert send(manager, conn, "a", commit=True) is not None, "it ran: its lock is free again"
    manager.close()


def test_two_copies_in_one_transaction_keep_one(sqlite_url: str) -> None:
    manager = make_manager(sqlite_url)
    with closing(connect(sqlite_url)) as conn:
        ids = manager.send_queued("db", [manager.build(Once("b")), manager.build(Once("b"))], within=conn)
        conn.commit()
    assert ids[0] is not None and ids[1] is None
    assert manager.connection().size() == 1
    manager.close()


def test_a_second_dispatch_waits_for_the_first_transaction(pg_url: str) -> None:
    """While the first transaction is open its lock row is held: the second
    dispatch of the job waits, and once the first commits it is a duplicate."""
    manager = make_manager(pg_url)
    first, second = connect(pg_url), connect(pg_url)
    assert manager.pending(Once("c")).within(first).send() is not None
    result: list[str | None] = []
    waiting = threading.Thread(target=lambda: result.append(send(manager, second, "c", commit=True)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not result, "it waits for the first transaction"
    first.commit()
    waiting.join(10)
    assert result == [None]
    assert manager.connection().size() == 1
    first.close()
    second.close()
    manager.close()


def test_a_lock_store_elsewhere_takes_the_lock_at_dispatch(sqlite_url: str) -> None:
    """The lock store cannot see the caller's transaction: the lock is taken at
    dispatch, and a rollback leaves it until it lapses (the documented cost)."""
    registry = JobRegistry().with_job(Once)
    manager = QueueManager(
        connections={"db": DatabaseQueue.from_url(sqlite_url)}, registry=registry, locks=MemoryLockStore()
    )
    with closing(connect(sqlite_url)) as conn:
        assert send(manager, conn, "d", commit=False) is not None
        assert manager.locks is not None and manager.locks.owner("dbtest.once:d") is not None
        assert send(manager, conn, "d", commit=True) is None
    manager.close()


# -- autocommit ----------------------------------------------------------------------------------


def test_a_connection_in_autocommit_mode_is_refused_outside_a_transaction(db_url: str) -> None:
    manager = make_manager(db_url)
    with closing(connect(db_url, autocommit=True)) as conn:
        with pytest.raises(TypeError) as caught:
            manager.pending(Hello("at once")).within(conn).send()
        message = str(caught.value)
        assert "is in autocommit mode" in message and "not inside a transaction" in message
        assert f"{type(conn).__module__}.{type(conn).__qualname__}" in message
        assert manager.connection().size() == 0
        begin(conn)
        manager.pending(Hello("rolled back")).within(conn).send()
        conn.rollback()
        begin(conn)
        kept = manager.pending(Hello("kept")).within(conn).send()
        conn.commit()
    assert kept is not None and manager.connection().size() == 1
    assert once(manager).processed == 1 and ran == ["kept"]
    manager.close()


def test_a_sqlalchemy_connection_in_autocommit_is_refused(db_url: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from .test_sqlalchemy import sqlalchemy_url

    manager = make_manager(db_url)
    engine = sqlalchemy.create_engine(sqlalchemy_url(db_url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn, pytest.raises(TypeError, match="a SQLAlchemy Connection on .* autocommit mode"):
            manager.pending(Hello("at once")).within(conn).send()
    finally:
        engine.dispose()
    assert manager.connection().size() == 0
    manager.close()
