"""The database driver against the real servers: URLs, migrations, transactional
dispatch, frozen time, unreadable rows, locks, wake-ups and reconnecting."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.database import DatabaseLockStore, DatabaseQueue, DatabaseUnavailableError, SchemaMissingError
from rainier_sync.errors import ConfigurationError
from rainier_sync.locks import DatabaseLockStore as LazyLockStore
from rainier_sync.types import QueuedJob
from tests.support import free_port, wait_until

ran: list[str] = []


@dataclass
class Hello(Job):
    NAME = "dbtest.hello"
    TRIES = 2
    BACKOFF = 30

    who: str
    fail_first: bool = False

    def handle(self, context: JobContext) -> None:
        if self.fail_first and context.attempt == 1:
            raise RuntimeError("first attempt fails")
        ran.append(self.who)


@dataclass
class Once(Job):
    NAME = "dbtest.once"

    key: str

    def handle(self, context: JobContext) -> None:
        ran.append(self.key)

    def unique_id(self) -> str | None:
        return self.key


@dataclass
class Plain(Job):
    NAME = "dbtest.plain"

    n: int
    blob: Any = None

    def handle(self, context: JobContext) -> None:
        ran.append(str(self.n))


def make_manager(url: str, **kwargs: Any) -> QueueManager:
    queue = DatabaseQueue.from_url(url, **kwargs)
    return QueueManager(
        connections={"db": queue},
        registry=JobRegistry().with_job(Hello).with_job(Once).with_job(Plain),
        container=Container(),
        locks=queue.lock_store(),
    )


def once(manager: QueueManager) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


# -- URLs and boot errors --------------------------------------------------------------------------


def test_sqlite_urls_relative_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = DatabaseQueue.from_url("sqlite:///rel.db")
    relative.migrate()
    relative.close()
    assert (tmp_path / "rel.db").exists()
    absolute = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'abs.db'}")  # sqlite:////tmp/...
    absolute.migrate()
    assert absolute.describe().endswith(f"{tmp_path / 'abs.db'})")
    assert absolute._backend.query("PRAGMA journal_mode")[0][0] == "wal"
    assert absolute._backend.query("PRAGMA synchronous")[0][0] == 1  # NORMAL
    assert absolute._backend.query("PRAGMA wal_autocheckpoint")[0][0] == 10_000
    absolute.close()
    full = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'abs.db'}?synchronous=FULL&wal_autocheckpoint=500")
    assert full._backend.query("PRAGMA synchronous")[0][0] == 2
    assert full._backend.query("PRAGMA wal_autocheckpoint")[0][0] == 500
    full.close()


@pytest.mark.parametrize(
    "url, says",
    [
        ("jobs.db", "not a URL"),
        ("oracle://host/db", "'oracle' is not supported"),
        ("sqlite://host/jobs.db", "has a host"),
        ("sqlite:///jobs.db?synchronous=SOMETIMES", "synchronous='SOMETIMES'"),
        ("sqlite:///jobs.db?busy_timeout=soon", "busy_timeout='soon' must be a whole number"),
        ("sqlite:///jobs.db?wal_autocheckpoint=-1", "wal_autocheckpoint='-1' must be a whole number"),
        ("sqlite:////no/such/dir/jobs.db", "directory '/no/such/dir' does not exist"),
    ],
)
def test_bad_urls_are_refused_naming_the_fault(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says.replace("(", r"\(")):
        DatabaseQueue.from_url(url)


def test_bad_options_are_refused(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="reservation"):
        DatabaseQueue.from_url(sqlite_url, reservation=0)
    with pytest.raises(ValueError, match="skip_locked' needs PostgreSQL"):
        DatabaseQueue.from_url(sqlite_url, claim="skip_locked")


def test_unreachable_postgres_is_a_boot_error_naming_the_host(postgres_url: str) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError, match=f"PostgreSQL at 127.0.0.1:{port}/test"):
        DatabaseQueue.from_url(f"postgresql://postgres@127.0.0.1:{port}/test")
    assert time.monotonic() - started < 5


def test_postgres_connections_use_tcp_keepalives_unless_the_url_says_otherwise(postgres_url: str) -> None:
    from rainier_sync.drivers.database._connection import connect
    from rainier_sync.drivers.database.url import DatabaseUrl

    default = connect(DatabaseUrl.parse(postgres_url))
    tuned = connect(DatabaseUrl.parse(postgres_url + ("&" if "?" in postgres_url else "?") + "keepalives_idle=5"))
    try:
        assert "keepalives=1 keepalives_idle=30 keepalives_interval=10 keepalives_count=3" in default.info.dsn
        assert "keepalives_idle=5" in tuned.info.dsn
    finally:
        default.close()
        tuned.close()


def test_a_server_that_never_answers_times_out_instead_of_hanging(postgres_url: str) -> None:
    with socket.socket() as silent:  # accepts TCP connections and never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailableError, match=f"127.0.0.1:{port}"):
            DatabaseQueue.from_url(f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2")
        assert time.monotonic() - started < 15


def test_unreachable_mysql_is_a_boot_error_naming_the_host(mysql_url: str) -> None:
    port = free_port()
    with pytest.raises(DatabaseUnavailableError, match=f"MySQL/MariaDB at 127.0.0.1:{port}/test"):
        DatabaseQueue.from_url(f"mysql://root@127.0.0.1:{port}/test")


# -- migrations ---------------------------------------------------------------------------------------


def test_migrations_are_versioned_and_idempotent(tmp_path: Path) -> None:
    migrations = DatabaseQueue.migrations()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    for dialect in ("sqlite", "postgresql", "mysql"):
        assert any("rainier_jobs" in s for s in migrations[0].sql(dialect))
    queue = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'm.db'}")
    assert queue.migrate() == [m.version for m in migrations]
    assert queue.migrate() == []
    tables = {r[0] for r in queue._backend.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"rainier_jobs", "rainier_failed_jobs", "rainier_locks", "rainier_migrations"} <= tables
    queue.close()


def test_migrate_twice_on_postgres_and_mysql(pg_url: str, my_url: str) -> None:
    for url in (pg_url, my_url):
        queue = DatabaseQueue.from_url(url)
        assert queue.migrate() == []  # the session's migration already ran
        queue.close()


def test_missing_tables_say_to_migrate(tmp_path: Path) -> None:
    queue = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(SchemaMissingError, match="run DatabaseQueue.migrate"):
        queue.size()
    queue.close()


# -- transactional dispatch -------------------------------------------------------------------------


def test_dispatch_within_a_sqlite_transaction(sqlite_url: str) -> None:
    manager = make_manager(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.execute("INSERT INTO orders (id) VALUES (1)")
    kept = manager.pending(Hello("kept")).within(conn).send()
    conn.commit()
    conn.execute("INSERT INTO orders (id) VALUES (2)")
    manager.pending(Hello("rolled back")).within(conn).send()
    conn.rollback()
    conn.close()
    queue = manager.connection()
    assert queue.size() == 1
    job = queue.reserve(["default"])
    assert job is not None and job.id == kept and job.payload == {"who": "kept", "fail_first": False}
    manager.close()


def test_dispatch_within_a_psycopg_transaction(pg_url: str) -> None:
    import psycopg

    manager = make_manager(pg_url)
    with psycopg.connect(pg_url) as conn:
        with conn.transaction():
            kept = manager.pending(Hello("kept")).within(conn).send()
        with pytest.raises(ZeroDivisionError), conn.transaction():
            manager.pending(Hello("rolled back")).within(conn).send()
            raise ZeroDivisionError
    assert manager.connection().size() == 1
    assert once(manager).processed == 1 and ran == ["kept"]
    assert kept is not None
    manager.close()


def test_dispatch_within_the_wrong_connection_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    manager = make_manager(sqlite_url)
    with pytest.raises(TypeError, match="needs an open sqlite connection"):
        manager.pending(Hello("x")).within(object()).send()
    other = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(TypeError, match="not on the queue's file"):
        manager.pending(Hello("x")).within(other).send()
    other.close()
    manager.close()


# -- frozen time --------------------------------------------------------------------------------------


def test_freezegun_moves_delays_and_backoff_for_a_once_worker(db_url: str) -> None:
    with freeze_time("2026-05-01 09:00:00") as frozen:
        manager = make_manager(db_url)
        manager.dispatch_after(60, Hello("later"))
        manager.dispatch(Hello("flaky", fail_first=True))
        stats = once(manager)
        assert (stats.processed, stats.released) == (0, 1), "the delayed job is not due; the flaky one backs off"
        frozen.tick(29)
        assert once(manager).processed == 0
        frozen.tick(2)
        assert once(manager).processed == 1 and ran == ["flaky"]
        frozen.tick(30)
        assert once(manager).processed == 1 and ran == ["flaky", "later"]
        assert manager.connection().size() == 0
        manager.close()


# -- rows the worker cannot run --------------------------------------------------------------------


def test_unreadable_rows_are_failed_with_a_clear_error_and_the_worker_goes_on(db_url: str) -> None:
    manager = make_manager(db_url)
    queue = manager.connection()
    assert isinstance(queue, DatabaseQueue)
    insert = queue._sql.insert_job()
    queue._backend.execute(insert, ("bad-json", "default", "dbtest.hello", "{not json", 0, 0, 0.0))
    stranger = QueuedJob(id="stranger", name="nobody.knows-me", queue="default", payload={})
    queue._backend.execute(insert, ("stranger", "default", stranger.name, stranger.encode(), 0, 0, 0.0))
    manager.dispatch(Hello("fine"))
    discarded: list[str] = []

    def on_discard(sender: object, **kw: Any) -> None:
        discarded.append(kw["error"])

    signals.queue_message_discarded.connect(on_discard)
    try:
        stats = once(manager)
    finally:
        signals.queue_message_discarded.disconnect(on_discard)
    assert ran == ["fine"] and stats.processed == 1
    failed = {f.id: f for f in queue.failed_jobs(10)}
    assert set(failed) == {"bad-json", "stranger"}
    assert "not valid JSON" in failed["bad-json"].error and failed["bad-json"].name == "dbtest.hello"
    assert "nobody.knows-me" in failed["stranger"].error
    assert len(discarded) == 1 and "not valid JSON" in discarded[0]
    assert queue.size() == 0 and queue.failed_count() == 2
    manager.close()


# -- inspection ---------------------------------------------------------------------------------------


def test_counts_and_queue_names(db_url: str) -> None:
    with freeze_time("2026-05-01 09:00:00"):
        manager = make_manager(db_url)
        queue = manager.connection()
        manager.dispatch_on("mail", Hello("a"))
        manager.dispatch_on("mail", Hello("b"))
        manager.pending(Hello("c")).on_queue("mail").delay(30).send()
        manager.dispatch_on("other", Hello("d"))
        assert queue.reserve(["mail"]) is not None
        counts = queue.counts("mail")
        assert (counts.ready, counts.delayed, counts.reserved) == (1, 1, 1)
        assert queue.queue_names() == ["mail", "other"]
        assert queue.size() == 4 and queue.size("mail") == 3
        manager.close()


def test_extend_renews_every_running_job_in_one_statement(sqlite_url: str) -> None:
    with freeze_time("2026-05-01 09:00:00") as frozen:
        queue = DatabaseQueue.from_url(sqlite_url, reservation=10)
        for n in range(5):
            queue.push(QueuedJob(id=f"j{n}", name="x", queue="default", payload={}, available_at=0))
        held = queue.reserve_many(["default"], 5)
        statements: list[str] = []
        queue._backend.db.connection.set_trace_callback(statements.append)
        queue.extend(held, 10)
        queue._backend.db.connection.set_trace_callback(None)
        assert len([s for s in statements if s.startswith("UPDATE")]) == 1
        frozen.tick(8)
        queue.extend(held, 10)
        frozen.tick(8)
        assert queue.reclaim_expired() == 0
        frozen.tick(3)
        assert queue.reclaim_expired() == 5
        queue.close()


def test_failing_a_job_whose_reservation_lapsed_does_not_leave_a_second_copy(db_url: str) -> None:
    with freeze_time("2026-05-01 09:00:00") as frozen:
        queue = DatabaseQueue.from_url(db_url, reservation=10)
        queue.push(QueuedJob(id="lapsed", name="x", queue="default", payload={}, available_at=0))
        queue.push(QueuedJob(id="taken", name="x", queue="default", payload={}, available_at=0))
        first, second = queue.reserve_many(["default"], 2)
        frozen.tick(11)  # the worker stopped beating: both reservations lapse
        assert queue.reclaim_expired() == 2
        again = queue.reserve(["default"])  # another worker claims one of them again
        assert again is not None
        mine = first if again.id == second.id else second
        theirs = second if mine is first else first
        queue.fail(mine, "its last attempt failed")  # reclaimed, not claimed again: out of the jobs table
        queue.fail(theirs, "its last attempt failed")  # claimed again: that worker's run decides
        assert queue.size("default") == 1, "only the job another worker holds is still queued"
        assert [f.id for f in queue.failed_jobs()] == [mine.id]
        assert queue.retry_failed(mine.id) is True
        assert queue.size("default") == 2, "a retry queues one copy of each job, not two"
        queue.close()


def test_an_error_longer_than_a_mariadb_text_column_still_fails_the_job(my_url: str) -> None:
    # MariaDB's TEXT refuses more than 65,535 bytes: fail() raised, and the worker
    # retried that settle forever, never reserving another job.
    queue = DatabaseQueue.from_url(my_url)
    queue.push(QueuedJob(id="loud", name="x", queue="default", payload={}, available_at=0))
    held = queue.reserve(["default"])
    assert held is not None
    queue.fail(held, RuntimeError("upstream said: " + "é" * 40_000))
    assert queue.size() == 0
    (failed,) = queue.failed_jobs()
    assert failed.error.startswith("RuntimeError: upstream said: ééé")
    assert len(failed.error.encode()) <= 65_535
    assert failed.exception.message.endswith("é" * 40_000), "the exception keeps the whole message"
    queue.close()


def test_jobs_claimed_before_a_later_claim_fails_are_handed_out(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The claim on "high" succeeds, the one on "default" fails (SQLite busy past its
    # timeout, a lost connection): the "high" job is reserved, so it must reach the
    # worker rather than wait out its reservation with nobody running it.
    queue = DatabaseQueue.from_url(db_url)
    queue.push(QueuedJob(id="first", name="x", queue="high", payload={}, available_at=0))
    queue.push(QueuedJob(id="second", name="x", queue="default", payload={}, available_at=0))
    path = {"skip_locked": "_claim_skip_locked", "optimistic": "_claim_optimistic"}[queue.claim]
    if queue.dialect == "sqlite":
        path = "_claim_sqlite"
    real = getattr(queue, path)

    def claim(name: str, limit: int, *acks: Any) -> list[Any]:
        if name == "default":
            raise sqlite3.OperationalError("database is locked")
        return list(real(name, limit, *acks))

    monkeypatch.setattr(queue, path, claim)
    assert [job.id for job in queue.reserve_many(["high", "default"], 2)] == ["first"]
    with pytest.raises(sqlite3.OperationalError):
        queue.reserve_many(["default"], 1)  # nothing claimed yet: the error is the answer
    queue.close()


def test_a_failed_move_of_an_unreadable_row_does_not_hold_back_the_rest_of_the_batch(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = DatabaseQueue.from_url(db_url)
    insert = queue._sql.insert_job()
    queue._backend.execute(insert, ("bad-json", "default", "x", "{not json", 0, 0, 0.0))
    queue.push(QueuedJob(id="fine", name="x", queue="default", payload={}, available_at=1.0))

    def broken(*args: Any) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(queue, "_discard", broken)
    assert [job.id for job in queue.reserve_many(["default"], 2)] == ["fine"]
    monkeypatch.undo()
    assert queue.counts("default").reserved == 2, "the unreadable row waits out its reservation, then is moved"
    queue.close()


def test_an_optimistic_claim_hands_out_its_first_round_when_a_later_round_fails(
    my_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = DatabaseQueue.from_url(my_url)
    rival = DatabaseQueue.from_url(my_url)
    for n in range(3):
        queue.push(QueuedJob(id=f"j{n}", name="x", queue="default", payload={}, available_at=float(n)))
    backend = queue._worker
    real_stamped, real_query = backend.stamped, backend.query
    calls = {"select": 0}

    def stamped(sql: str, params: Any, fetch: bool = False) -> Any:
        if sql.startswith("UPDATE") and calls["select"] == 1:
            assert rival.reserve(["default"]) is not None  # wins one candidate: a second round follows
        return real_stamped(sql, params, fetch=fetch)

    def query(sql: str, params: Any = ()) -> list[Any]:
        if sql.startswith("SELECT seq FROM"):
            calls["select"] += 1
            if calls["select"] == 2:
                raise ConnectionError("the second round failed")
        return real_query(sql, params)

    monkeypatch.setattr(backend, "stamped", stamped)
    monkeypatch.setattr(backend, "query", query)
    assert [job.id for job in queue.reserve_many(["default"], 2)] == ["j1"]
    rival.close()
    queue.close()


def test_a_heartbeat_after_a_reclaim_takes_back_a_job_nobody_claimed_since(db_url: str) -> None:
    # The worker's loop stalled past the reservation (a database outage, say), and a
    # reclaim ran before its next heartbeat: the job is still running here, so the
    # heartbeat keeps it rather than let another worker start it a second time.
    with freeze_time("2026-05-01 09:00:00") as frozen:
        queue = DatabaseQueue.from_url(db_url, reservation=10)
        rival = DatabaseQueue.from_url(db_url, reservation=10)
        for n in range(3):
            queue.push(QueuedJob(id=f"j{n}", name="x", queue="default", payload={}, available_at=float(n)))
        held = queue.reserve_many(["default"], 2)
        frozen.tick(11)
        assert rival.reclaim_expired() == 2
        taken = rival.reserve(["default"])  # claims the oldest again: that one is the rival's now
        assert taken is not None and taken.id == "j0"
        queue.extend(held)
        assert rival.reserve(["default"]) is not None  # j2, never ours
        assert rival.reserve(["default"]) is None, "j1 is running here: the heartbeat took it back"
        frozen.tick(5)
        assert queue.reclaim_expired() == 0
        queue.acknowledge_many(held)
        assert queue.size("default") == 2, "j0 (the rival's claim) and j2 remain; j1 is done"
        rival.close()
        queue.close()


def test_two_concurrent_retries_of_the_same_failed_jobs_queue_each_once(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    count = 200
    queue.push_many([QueuedJob(id=f"f{n}", name="x", queue="default", payload={}) for n in range(count)])
    for job in queue.reserve_many(["default"], count):
        queue.fail(job, "no")
    operators = [DatabaseQueue.from_url(db_url), DatabaseQueue.from_url(db_url)]
    retried: list[int] = []

    def retry_all(operator: DatabaseQueue) -> None:
        retried.append(sum(operator.retry_failed(f"f{n}") for n in range(count)))

    threads = [threading.Thread(target=retry_all, args=(operator,)) for operator in operators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(retried) == count and queue.size("default") == count, "each failed job is queued again once"
    for operator in operators:
        operator.close()
    queue.close()


# -- locks and unique jobs -------------------------------------------------------------------------


def test_lock_store_owner_semantics(db_url: str) -> None:
    with freeze_time("2026-05-01 09:00:00") as frozen:
        locks = LazyLockStore.from_url(db_url)
        assert isinstance(locks, DatabaseLockStore)
        assert locks.acquire("k", "alice", 10) is True
        assert locks.acquire("k", "bob", 10) is False
        assert locks.owner("k") == "alice"
        assert locks.release("k", "bob") is False
        assert locks.renew("k", "bob", 10) is False
        frozen.tick(8)
        assert locks.renew("k", "alice", 10) is True
        frozen.tick(8)
        assert locks.owner("k") == "alice"
        frozen.tick(3)
        assert locks.owner("k") is None
        assert locks.acquire("k", "bob", 10) is True, "an expired lock is taken over"
        assert locks.release("k", "alice") is False
        assert locks.release("k", "bob") is True
        assert locks.owner("k") is None
        locks.close()


def test_unique_jobs_are_deduplicated_until_done(db_url: str) -> None:
    manager = make_manager(db_url)
    first = manager.dispatch(Once("report-7"))
    assert first is not None
    assert manager.dispatch(Once("report-7")) is None
    assert manager.dispatch(Once("report-8")) is not None
    assert once(manager).processed == 2
    assert manager.dispatch(Once("report-7")) is not None, "the lock is released once the job succeeded"
    manager.close()


# -- waking an idle worker ------------------------------------------------------------------------


def _wait_in_thread(queue: DatabaseQueue, waker: Waker) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        queue.wait_for_jobs(["default"], 20.0, waker)
        took.append(time.monotonic() - started)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, took


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_an_idle_wait_ends_when_another_process_dispatches(dialect: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("sqlite_url" if dialect == "sqlite" else "pg_url")
    worker_side = DatabaseQueue.from_url(url)
    producer = DatabaseQueue.from_url(url)  # its own connection, as another process would have
    waker = Waker()
    thread, took = _wait_in_thread(worker_side, waker)
    time.sleep(0.2)  # let the wait begin (it must be waiting, not just starting)
    producer.push(QueuedJob(id="wake", name="x", queue="default", payload={}, available_at=0))
    thread.join(10)
    assert took and took[0] < 10, "the wait should end on the dispatch, not at its 20 s timeout"
    producer.close()
    worker_side.close()
    waker.close()


def test_two_workers_waiting_on_one_postgres_driver_each_wake_for_their_own_queue(pg_url: str) -> None:
    # Two workers of one process share the manager's driver, and so its LISTEN
    # connection; the one waiting on "a" must not read and drop the wake-up for "b".
    shared = DatabaseQueue.from_url(pg_url)
    producer = DatabaseQueue.from_url(pg_url)  # another process, in effect
    for round_ in range(8):
        took: dict[str, float] = {}
        on_a, on_b = Waker(), Waker()

        def wait(name: str, waker: Waker, took: dict[str, float]) -> None:
            started = time.monotonic()
            shared.wait_for_jobs([name], 5.0, waker)
            took[name] = time.monotonic() - started

        threads = [threading.Thread(target=wait, args=(name, w, took)) for name, w in (("a", on_a), ("b", on_b))]
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        producer.push(QueuedJob(id=f"b{round_}", name="x", queue="b", payload={}, available_at=0))
        threads[1].join(10)
        on_a.set()
        threads[0].join(10)
        assert took["b"] < 4, f"round {round_}: the wait on 'b' slept through a dispatch to 'b'"
        producer._backend.execute("DELETE FROM rainier_jobs")
        on_a.close()
        on_b.close()
    producer.close()
    shared.close()


@pytest.mark.parametrize("delay", [0, 1])
def test_an_idle_postgres_wait_ends_when_another_process_releases_a_job(pg_url: str, delay: int) -> None:
    # The released job was reserved when the wait looked for the soonest job, so
    # only a notification tells the idle worker it is (or soon will be) due.
    worker_side = DatabaseQueue.from_url(pg_url)
    other = DatabaseQueue.from_url(pg_url)  # another worker process
    other.push(QueuedJob(id="retry-me", name="x", queue="default", payload={}, available_at=0))
    held = other.reserve(["default"])
    assert held is not None
    waker = Waker()
    thread, took = _wait_in_thread(worker_side, waker)
    time.sleep(0.2)
    other.release(held, delay)
    thread.join(10)
    if took and took[0] < delay + 5:
        # A delayed release ends the wait so it can sleep until the job is due.
        thread, took = _wait_in_thread(worker_side, waker)
        thread.join(10)
    assert took and took[0] < delay + 5, "the wait should end when the released job is due, not at its 20 s timeout"
    wait_until(lambda: worker_side.reserve(["default"]) is not None, timeout=5, message="the released job to be due")
    other.close()
    worker_side.close()
    waker.close()


def test_an_idle_wait_ends_on_the_waker(sqlite_url: str) -> None:
    queue = DatabaseQueue.from_url(sqlite_url)
    waker = Waker()
    thread, took = _wait_in_thread(queue, waker)
    waker.set()
    thread.join(10)
    assert took and took[0] < 10
    queue.close()
    waker.close()


# -- reconnecting ----------------------------------------------------------------------------------


def test_a_terminated_postgres_connection_is_reopened(pg_url: str) -> None:
    import psycopg

    queue = DatabaseQueue.from_url(pg_url, application_name="rainier-reconnect-test")
    queue.push(QueuedJob(id="before", name="x", queue="default", payload={}, available_at=0))
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            ("rainier-reconnect-test",),
        ).fetchone()
    assert killed is not None and killed[0] == 1
    queue.push(QueuedJob(id="after", name="x", queue="default", payload={}, available_at=0))
    assert sorted(j.id for j in queue.reserve_many(["default"], 5)) == ["after", "before"]
    queue.close()


# -- the claim's plan ------------------------------------------------------------------------------------


def test_the_claim_uses_the_partial_index_with_a_large_backlog(pg_url: str, sqlite_url: str) -> None:
    jobs = [QueuedJob(id=f"b{n}", name="x", queue="default", payload={}, available_at=n) for n in range(20_000)]
    pg = DatabaseQueue.from_url(pg_url)
    pg.push_many(jobs)
    pg._backend.execute("ANALYZE rainier_jobs")
    plan = "\n".join(
        r[0]
        for r in pg._backend.query(
            "EXPLAIN SELECT seq FROM rainier_jobs WHERE queue = 'default' AND reserved_at IS NULL "
            "AND available_at <= 1e12 ORDER BY priority, available_at, seq LIMIT 8 FOR UPDATE SKIP LOCKED"
        )
    )
    assert "rainier_jobs_ready" in plan and "Seq Scan" not in plan, plan
    pg.close()
    lite = DatabaseQueue.from_url(sqlite_url)
    lite.push_many(jobs)
    plan = " ".join(
        str(r[-1])
        for r in lite._backend.query(
            "EXPLAIN QUERY PLAN SELECT seq FROM rainier_jobs WHERE queue = 'default' AND reserved_at IS NULL "
            "AND (available_at <= 1e12 OR typeof(available_at) NOT IN ('real', 'integer')) "
            "ORDER BY priority, available_at, seq LIMIT 8"
        )
    )
    assert "USING INDEX rainier_jobs_ready" in plan and "TEMP B-TREE" not in plan, plan
    lite.close()


def test_dispatch_within_a_mariadb_transaction(my_url: str) -> None:
    import urllib.parse

    import pymysql

    manager = make_manager(my_url)
    parts = urllib.parse.urlsplit(my_url)
    conn = pymysql.connect(
        host=parts.hostname, port=parts.port or 3306, user=parts.username, database=parts.path.lstrip("/")
    )
    conn.begin()
    kept = manager.pending(Hello("kept")).within(conn).send()
    conn.commit()
    conn.begin()
    manager.pending(Hello("rolled back")).within(conn).send()
    conn.rollback()
    conn.close()
    assert manager.connection().size() == 1
    assert once(manager).processed == 1 and ran == ["kept"] and kept is not None
    manager.close()


def test_a_listen_connection_lost_while_it_opens_ends_the_wait_and_reopens_next_time(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from rainier_sync.drivers.database import listen

    real_connect = listen.connect
    opened: list[int] = []

    def connect_then_lose(*args: Any, **kwargs: Any) -> Any:
        conn = real_connect(*args, **kwargs)
        if not opened:  # the first: terminated by the server before its LISTEN is sent
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        opened.append(conn.info.backend_pid)
        return conn

    monkeypatch.setattr(listen, "connect", connect_then_lose)
    queue = DatabaseQueue.from_url(pg_url)
    producer = DatabaseQueue.from_url(pg_url)
    waker = Waker()
    started = time.monotonic()
    queue.wait_for_jobs(["default"], 20.0, waker)  # no error escapes, and no 20 s sleep
    assert time.monotonic() - started < 10
    thread, took = _wait_in_thread(queue, waker)
    wait_until(lambda: len(opened) == 2, timeout=10, message="the next wait to open a new LISTEN connection")
    time.sleep(0.2)
    producer.push(QueuedJob(id="wake", name="x", queue="default", payload={}, available_at=0))
    thread.join(10)
    assert took and took[0] < 10, "the new LISTEN connection hears the dispatch"
    queue.close()
    producer.close()


def test_a_terminated_listen_connection_is_reopened_on_the_next_wait(pg_url: str) -> None:
    import psycopg

    # A name of this test's own: another session's run of it on the same server must not
    # have its listener counted (and terminated) here.
    name = f"rainier-listen-test-{uuid.uuid4().hex[:8]}"
    queue = DatabaseQueue.from_url(pg_url, application_name=name)
    producer = DatabaseQueue.from_url(pg_url)
    waker = Waker()
    thread, took = _wait_in_thread(queue, waker)
    with psycopg.connect(pg_url, autocommit=True) as admin:

        def terminate_the_listener() -> bool:
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (f"{name}-listen",),
            ).fetchone()
            return bool(row and row[0] == 1)

        wait_until(terminate_the_listener, timeout=10, message="the LISTEN connection to be terminated")
    thread.join(10)
    assert took and took[0] < 10, "a lost LISTEN connection ends the wait instead of sleeping through it"
    thread, took = _wait_in_thread(queue, waker)
    time.sleep(0.2)
    producer.push(QueuedJob(id="wake", name="x", queue="default", payload={}, available_at=0))
    thread.join(10)
    assert took and took[0] < 10, "the reopened LISTEN connection wakes the next wait"
    producer.close()
    queue.close()
    waker.close()


def test_producer_threads_share_one_driver_safely(db_url: str) -> None:
    manager = make_manager(db_url)
    errors: list[BaseException] = []

    def produce(thread: int) -> None:
        try:
            for n in range(100):
                manager.dispatch(Hello(f"{thread}-{n}"))
            manager.dispatch_many([Hello(f"{thread}-bulk-{n}") for n in range(100)])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    queue = manager.connection()
    assert queue.size("default") == 800
    taken = queue.reserve_many(["default"], 1000)
    assert len({job.payload["who"] for job in taken}) == 800
    manager.close()


def test_push_many_keeps_every_character_of_payload_queue_and_name(db_url: str) -> None:
    # PostgreSQL stores batches with COPY, whose text format gives tabs, line
    # breaks and backslashes meanings of their own.
    awkward = "tab\there, line\nbreak, cr\rreturn, back\\slash, \\N, quote\" and ✓"
    queue = DatabaseQueue.from_url(db_url)
    jobs = [
        QueuedJob(id=f"awk-{n}", name=f"odd\\name\t{n}", queue="q\\ue\tue", payload={"text": awkward, "n": n})
        for n in range(450)
    ]
    assert queue.push_many(jobs) == [job.id for job in jobs]
    taken = queue.reserve_many(["q\\ue\tue"], 500)
    assert sorted((j.id, j.name, j.payload["text"], j.payload["n"]) for j in taken) == sorted(
        (j.id, j.name, awkward, j.payload["n"]) for j in jobs
    )
    queue.close()


def test_a_push_many_that_fails_stores_none_of_its_jobs(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    good = QueuedJob(id="fine", name="x", queue="default", payload={})
    bad = QueuedJob(id="bad", name="x", queue="default", payload={}, available_at=float("nan"))
    with pytest.raises(ValueError):
        queue.push_many([good, bad])
    assert queue.size("default") == 0
    queue.close()


def numbered(prefix: str, count: int) -> list[QueuedJob]:
    """``count`` jobs due one after the other, with ids ``prefix0``, ``prefix1``..."""
    return [QueuedJob(id=f"{prefix}{n}", name="x", queue="default", payload={}, available_at=n) for n in range(count)]


def test_acknowledge_and_reserve_settles_and_claims_together(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    queue.push_many(numbered("j", 6))
    first = queue.reserve_many(["default"], 3)
    assert [j.id for j in first] == ["j0", "j1", "j2"]
    second = queue.acknowledge_and_reserve(first, ["default"], 3)
    assert [j.id for j in second] == ["j3", "j4", "j5"]
    assert queue.size("default") == 3, "the first three are gone, the next three reserved"
    assert queue.acknowledge_and_reserve(second, ["default"], 3) == []
    assert queue.size("default") == 0
    queue.close()


def test_give_back_frees_unstarted_jobs_without_counting_their_attempt(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    queue.push_many(numbered("g", 3))
    taken = queue.reserve_many(["default"], 3)
    queue.give_back(taken[1:])
    assert queue.counts("default").reserved == 1
    again = queue.reserve_many(["default"], 3)
    assert [(j.id, j.attempts) for j in again] == [("g1", 1), ("g2", 1)]
    queue.close()


def test_dispatch_many_stores_slices_as_they_are_built(db_url: str) -> None:
    manager = make_manager(db_url)
    ids = manager.dispatch_many(Plain(n) for n in range(450))
    assert len(set(ids)) == 450 and None not in ids
    unique = manager.dispatch_many([Once("a"), Once("a"), Once("b")])  # taking their locks first
    assert unique[1] is None and None not in (unique[0], unique[2])
    assert manager.connection().size() == 452
    assert Worker(manager, options=WorkerOptions(once=True, concurrency=4)).run().processed == 452
    assert sorted(ran) == sorted([str(n) for n in range(450)] + ["a", "b"])
    manager.close()


def test_a_dispatch_many_with_a_bad_job_in_a_late_slice_stores_nothing(db_url: str) -> None:
    from rainier_sync.errors import PayloadError

    manager = make_manager(db_url)
    jobs = [Plain(n) for n in range(400)] + [Plain(1, blob=object())]
    with pytest.raises(PayloadError, match="blob"):
        manager.dispatch_many(jobs)
    assert manager.connection().size() == 0
    manager.close()


def test_a_dispatch_many_whose_connection_dies_mid_copy_stores_every_job_once(pg_url: str) -> None:
    import psycopg

    manager = make_manager(pg_url, application_name="rainier-copy-loss-test")
    queue = manager.connection()
    real_copy_in = queue._copy_in  # type: ignore[attr-defined]
    calls = {"n": 0}

    def copy_in_losing_the_connection(cursor: Any, slices: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            next(iter(slices))  # the first slice is built and sent, then the server goes away
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    ("rainier-copy-loss-test",),
                )
            cursor.execute("SELECT 1")
        real_copy_in(cursor, slices)

    queue._copy_in = copy_in_losing_the_connection  # type: ignore[attr-defined]
    ids = manager.dispatch_many([Plain(n) for n in range(500)])
    assert calls["n"] == 2, "the transaction ran again on a new connection"
    assert queue.size() == 500
    rows = queue._backend.query("SELECT count(DISTINCT id) FROM rainier_jobs")  # type: ignore[attr-defined]
    assert rows[0][0] == 500 and set(ids) == {r[0] for r in queue._backend.query("SELECT id FROM rainier_jobs")}  # type: ignore[attr-defined]
    manager.close()
