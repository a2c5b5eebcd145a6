"""Waiting for a value (``result(wait=...)``) on PostgreSQL: woken by NOTIFY on one
LISTEN connection the store's waiting threads share, polling with ``listen=false``,
and carrying on when the LISTEN connection is lost. Against the real server."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Iterator

import psycopg
import pytest

from rainier_sync.locks import DatabaseLockStore
from tests.support import wait_until

pytestmark = [pytest.mark.postgres]


class Counting(DatabaseLockStore):
    """Counts its reads of values."""

    reads = 0

    def get_value(self, key: str) -> str | None:
        self.reads += 1
        return super().get_value(key)


@pytest.fixture
def url(pg_url: str) -> str:
    store = DatabaseLockStore.from_url(pg_url)
    store.migrate()
    store.close()
    return pg_url


@pytest.fixture
def store(url: str) -> Iterator[Counting]:
    made = Counting.from_url(url)
    assert isinstance(made, Counting)
    yield made
    made.close()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every LISTEN connection a store opens for its waits (this test's own, whatever else runs)."""
    from rainier_sync.drivers.database import _connection

    made: list[Any] = []
    real = _connection.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        conn = real(*args, **kwargs)
        if str(kwargs.get("application_name", "")).endswith("-values"):
            made.append(conn)
        return conn

    monkeypatch.setattr(_connection, "connect", connect)
    return made


def listening(url: str, conn: Any) -> bool:
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND query LIKE 'LISTEN%%'",
            (conn.info.backend_pid,),
        ).fetchone()
    return row is not None and int(row[0]) == 1


def not_pending(value: str | None) -> bool:
    return value != "pending"


def put_later(store: DatabaseLockStore, key: str, value: str, after: threading.Event) -> threading.Thread:
    def put() -> None:
        after.wait(10)
        store.put_value(key, value, 60)

    thread = threading.Thread(target=put)
    thread.start()
    return thread


def test_a_waiter_is_woken_by_notify_not_by_polling(store: Counting, url: str) -> None:
    key = f"result:{uuid.uuid4().hex}"
    store.put_value(key, "pending", 60)
    other = DatabaseLockStore.from_url(url)  # another process's store, say: the worker's
    waiting = threading.Event()
    original = store.get_value

    def read(name: str) -> str | None:
        value = original(name)
        if store.reads == 2:  # the read after the LISTEN: from here on only a NOTIFY wakes it
            threading.Timer(0.3, waiting.set).start()
        return value

    store.get_value = read  # type: ignore[method-assign]
    putter = put_later(other, key, "done", waiting)
    try:
        assert store.wait_value(key, 10, not_pending) == "done"
    finally:
        putter.join(10)
        other.close()
    assert store.reads == 3, f"read {store.reads} times in a wait of 0.3 s or more: it polled"


def test_waiting_threads_share_one_listen_connection(store: Counting, url: str, opened: list[Any]) -> None:
    keys = [f"result:{uuid.uuid4().hex}" for _ in range(6)]
    for key in keys:
        store.put_value(key, "pending", 60)
    got: dict[str, Any] = {}

    def wait(key: str) -> None:
        got[key] = store.wait_value(key, 20, not_pending)

    threads = [threading.Thread(target=wait, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(opened) == 1 and listening(url, opened[0]), 10.0, 0.02, "the store's LISTEN connection")
    other = DatabaseLockStore.from_url(url)
    try:
        for n, key in enumerate(keys):
            other.put_value(key, f"done {n}", 60)
            wait_until(lambda: key in got, 10.0, 0.01, f"waiter {n}")  # noqa: B023
    finally:
        other.close()
        for thread in threads:
            thread.join(20)
    assert got == {key: f"done {n}" for n, key in enumerate(keys)}
    assert len(opened) == 1, "one connection for every waiter of the store"


def test_a_lost_listen_connection_is_opened_again(store: Counting, url: str, opened: list[Any]) -> None:
    key = f"result:{uuid.uuid4().hex}"
    store.put_value(key, "pending", 60)
    got: list[str | None] = []
    waiter = threading.Thread(target=lambda: got.append(store.wait_value(key, 20, not_pending)))
    waiter.start()
    wait_until(lambda: len(opened) == 1 and listening(url, opened[0]), 10.0, 0.02, "the store's LISTEN connection")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (opened[0].info.backend_pid,))
    wait_until(lambda: len(opened) == 2 and listening(url, opened[1]), 10.0, 0.02, "a new LISTEN connection")
    store.put_value(key, "done", 60)
    waiter.join(20)
    assert got == ["done"]


def test_behind_a_transaction_pooler_a_wait_polls(url: str, opened: list[Any]) -> None:
    polling = Counting.from_url(url + "&listen=false")
    try:
        key = f"result:{uuid.uuid4().hex}"
        polling.put_value(key, "pending", 60)
        assert polling.wait_value(key, 0.3, not_pending) == "pending"
        assert polling.reads > 3, "it read the value again and again"
        assert opened == [], "no LISTEN behind a transaction-pooling proxy"
    finally:
        polling.close()


def test_dispatch_many_marks_results_pending_on_postgresql(url: str) -> None:
    """PostgreSQL stores ``dispatch_many`` as a stream; jobs that keep results are
    stored the other way, so that each is marked pending before it is stored."""
    from dataclasses import dataclass

    from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager
    from rainier_sync.drivers.database import DatabaseQueue

    @dataclass
    class Kept(Job):
        NAME = "dbtest.values.kept"
        KEEP_RESULT = 60

        def handle(self, context: JobContext) -> int:
            return 1

    queue = DatabaseQueue.from_url(url)
    manager = QueueManager({"db": queue}, registry=JobRegistry().with_job(Kept), container=Container(),
                           locks=queue.lock_store())  # fmt: skip
    try:
        ids = manager.dispatch_many([Kept(), Kept()])
        assert [manager.result(job_id).status for job_id in ids if job_id] == ["pending", "pending"]
    finally:
        queue._backend.execute("DELETE FROM rainier_jobs")
        queue.close()
