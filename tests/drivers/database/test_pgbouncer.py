"""``listen=false``: PostgreSQL behind a transaction-pooling pgbouncer. Idle
workers poll instead of ``LISTEN``, nothing is prepared on the server and no
session setting is made; and the driver works through a real pgbouncer."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.drivers.database.url import DatabaseUrl
from rainier_sync.errors import ConfigurationError
from rainier_sync.types import QueuedJob

from .support import pgbouncer_url
from .test_driver import Hello, Once, make_manager, once, ran


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


@pytest.fixture
def bouncer_url(request: pytest.FixtureRequest) -> str:
    url = pgbouncer_url(request)
    queue = DatabaseQueue.from_url(url)
    queue._backend.execute("TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks")
    queue.close()
    return url


def job(queue: str = "default", **payload: Any) -> QueuedJob:
    from rainier_sync import _clock

    now = _clock.now()
    return QueuedJob(
        id=uuid.uuid4().hex,
        name="pgb.job",
        queue=queue,
        payload=payload or {"n": 1},
        max_attempts=3,
        available_at=now,
        dispatched_at=now,
    )


# -- the option -------------------------------------------------------------------------------


def test_listen_in_the_url_is_the_drivers_own_option() -> None:
    target = DatabaseUrl.parse("postgresql://u@db.example:6432/app?listen=false&connect_timeout=3")
    assert target.listen is False
    assert target.url == "postgresql://u@db.example:6432/app?connect_timeout=3"
    assert DatabaseUrl.parse("postgresql://u@h/app").listen is True
    assert DatabaseUrl.parse("postgresql://u@h/app?listen=on").listen is True
    with pytest.raises(ConfigurationError, match="listen='maybe' must be true or false"):
        DatabaseUrl.parse("postgresql://u@h/app?listen=maybe")


def test_listen_must_be_a_bool(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="listen must be True or False"):
        DatabaseQueue.from_url(sqlite_url, listen="no")


def test_config_sets_listen(sqlite_url: str) -> None:
    manager = QueueManager.from_config(
        {"connections": {"db": {"driver": "database", "listen": False}}},
        environ={"DATABASE_URL": sqlite_url},
    )
    try:
        driver: Any = manager.connection("db")
        assert driver.listen is False
    finally:
        manager.close()


def test_the_argument_wins_over_the_url(pg_url: str) -> None:
    queue = DatabaseQueue.from_url(pg_url + "&listen=false", listen=True)
    assert queue.listen is True
    queue.close()


def test_without_listen_nothing_is_prepared_and_no_session_setting_is_made(pg_url: str) -> None:
    pooled = DatabaseQueue.from_url(pg_url, listen=False)
    direct = DatabaseQueue.from_url(pg_url)
    try:
        pooled.reserve(["default"])  # opens the worker's connection
        direct.reserve(["default"])
        for backend in (pooled._backend, pooled._worker):
            assert backend.db.connection.prepare_threshold is None
        assert pooled._worker.query("SHOW synchronous_commit") == [("on",)]
        # unchanged when listening
        assert direct._backend.db.connection.prepare_threshold == 5
        assert direct._worker.query("SHOW synchronous_commit") == [("off",)]
    finally:
        pooled.close()
        direct.close()


def test_without_listen_an_idle_wait_polls_and_sees_another_processs_dispatch(pg_url: str) -> None:
    waiting = DatabaseQueue.from_url(pg_url, listen=False, poll_interval=0.05)
    other = DatabaseQueue.from_url(pg_url)  # another instance: no in-process wake-up
    waker = Waker()
    returned = threading.Event()
    entered = threading.Event()
    waiting._wait_polling = _noting(waiting._wait_polling, entered)  # type: ignore[method-assign]

    def wait() -> None:
        waiting.wait_for_jobs(["default"], 20, waker)
        returned.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        assert entered.wait(10), "the wait never began polling"
        started = time.monotonic()
        other.push(job())
        assert returned.wait(10), "the wait did not see the dispatch"
        assert time.monotonic() - started < 5
        assert waiting._listener is None
    finally:
        waker.set()
        thread.join(10)
        waker.close()
        waiting.close()
        other.close()


def _noting(fn: Any, entered: threading.Event) -> Any:
    def noted(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        return fn(*args, **kwargs)

    return noted


# -- through a real pgbouncer in transaction mode -------------------------------------------------


def test_push_reserve_acknowledge_release_and_fail_through_pgbouncer(bouncer_url: str) -> None:
    queue = DatabaseQueue.from_url(bouncer_url)
    try:
        first, second, third = job(), job(), job()
        queue.push(first)
        queue.push_many([second, third])
        assert queue.size("default") == 3
        taken = queue.reserve_many(["default"], 3)
        assert {j.id for j in taken} == {first.id, second.id, third.id}
        by_id = {j.id: j for j in taken}
        queue.acknowledge(by_id[first.id])
        queue.release(by_id[second.id])
        queue.fail(by_id[third.id], "broken")
        assert queue.size("default") == 1 and queue.failed_count() == 1
        again = queue.reserve(["default"])
        assert again is not None and again.id == second.id and again.attempts == 2
        queue.acknowledge(again)
        assert queue.retry_failed(third.id)
        assert queue.size("default") == 1
    finally:
        queue.close()


def test_many_operations_from_several_threads_through_a_small_pool(bouncer_url: str) -> None:
    """More statements than psycopg's prepare threshold, from clients sharing three
    server connections: a statement prepared on one would be missing, or clash, on another."""
    queues = [DatabaseQueue.from_url(bouncer_url) for _ in range(4)]
    errors: list[BaseException] = []

    def work(queue: DatabaseQueue, name: str) -> None:
        try:
            for _ in range(30):
                queue.push(job(name))
                taken = queue.reserve([name])
                assert taken is not None
                queue.acknowledge(taken)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(q, f"q{i}")) for i, q in enumerate(queues)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for queue in queues:
        queue.close()
    assert not errors, errors


def test_a_worker_with_a_lock_store_through_pgbouncer(bouncer_url: str) -> None:
    manager = make_manager(bouncer_url)
    try:
        manager.dispatch(Hello("plain"))
        assert manager.dispatch(Once("k")) is not None
        assert manager.dispatch(Once("k")) is None  # unique: held in the lock store
        stats = once(manager)
        assert stats.processed == 2 and sorted(ran) == ["k", "plain"]
    finally:
        manager.close()


def test_an_idle_worker_through_pgbouncer_picks_up_a_dispatch(bouncer_url: str) -> None:
    manager = make_manager(bouncer_url, poll_interval=0.05)
    dispatcher = make_manager(bouncer_url)
    result: list[Any] = []
    worker = Worker(manager, options=WorkerOptions(max_jobs=1, sleep=5, concurrency=1))
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        dispatcher.dispatch(Hello("woken"))
        thread.join(15)
        assert not thread.is_alive() and result[0].processed == 1 and ran == ["woken"]
        assert manager.connection()._listener is None  # type: ignore[attr-defined]
    finally:
        if thread.is_alive():
            worker.stop()
            thread.join(15)
        manager.close()
        dispatcher.close()


def test_dispatch_within_a_transaction_through_pgbouncer(bouncer_url: str) -> None:
    import psycopg

    manager = make_manager(bouncer_url)
    conninfo = bouncer_url.split("?", 1)[0]
    try:
        with psycopg.connect(conninfo, prepare_threshold=None) as conn:
            with conn.transaction():
                manager.pending(Hello("kept")).within(conn).send()
            with pytest.raises(ZeroDivisionError), conn.transaction():
                manager.pending(Hello("rolled back")).within(conn).send()
                raise ZeroDivisionError
        assert manager.connection().size() == 1  # type: ignore[attr-defined]
    finally:
        manager.close()


def test_the_migration_runs_through_pgbouncer(bouncer_url: str) -> None:
    queue = DatabaseQueue.from_url(bouncer_url)
    try:
        assert queue.migrate() == []  # applied when the session's database was made; again is a no-op
    finally:
        queue.close()
