"""The relay: committed rows published in order, in batches, and deleted;
several relays at once never publish a row twice; it wakes on NOTIFY on
PostgreSQL and polls elsewhere; a unique job keeps its duplicates out; a
refused job is set aside, and a connection that is down waits its turn."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import urllib.parse
from contextlib import closing
from typing import Any, Iterator

import pytest

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.drivers.database import DatabaseLockStore
from rainier_sync.errors import QueueUnavailableError
from rainier_sync.outbox import Outbox, Relay
from tests.support import free_port, wait_until

from .conftest import clean_redis, make_redis, take
from .jobs import Note, OnlyOne, ran, registry
from .test_dispatch import manager_over, raw_connection


@pytest.fixture(autouse=True)
def _clear_ran() -> Iterator[None]:
    ran.clear()
    yield
    ran.clear()


def dispatch(manager: QueueManager, url: str, texts: list[str], per_transaction: int = 50) -> list[str | None]:
    ids: list[str | None] = []
    with closing(raw_connection(url)) as conn:
        for start in range(0, len(texts), per_transaction):
            for text in texts[start : start + per_transaction]:
                ids.append(manager.pending(Note(text)).within(conn).send())
            conn.commit()
    return ids


def rows(url: str) -> list[tuple[Any, ...]]:
    with closing(raw_connection(url)) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT seq, connection, body FROM rainier_outbox ORDER BY seq")
        found = list(cursor.fetchall())
        conn.commit()
        return found


def put_back(url: str, found: list[tuple[Any, ...]]) -> None:
    """What a relay killed after publishing and before deleting leaves: its rows."""
    with closing(raw_connection(url)) as conn:
        cursor = conn.cursor()
        mark = "?" if url.startswith("sqlite") else "%s"
        for _, connection, body in found:
            cursor.execute(f"INSERT INTO rainier_outbox (connection, body) VALUES ({mark}, {mark})", (connection, body))
        conn.commit()


def test_rows_are_relayed_in_order_in_batches(outbox_url: str, redis_target: BaseQueue) -> None:
    manager = manager_over(redis_target, outbox_url)
    texts = [f"n{i:03}" for i in range(250)]
    ids = dispatch(manager, outbox_url, texts)
    relay = Relay(manager, batch=40)
    assert relay.run_once() == 250
    assert manager.outbox is not None and manager.outbox.size() == 0
    taken = take(redis_target, 250)
    assert [job.payload["text"] for job in taken] == texts
    assert [job.id for job in taken] == ids
    manager.close()


def test_several_relays_at_once_publish_each_row_once(outbox_url: str, redis_url: str) -> None:
    """Each relay with its own outbox connection and Redis client, as separate processes would be."""
    prefix_driver = make_redis(redis_url)
    relays: list[Relay] = []
    for _ in range(3):
        driver = make_redis(redis_url)
        driver.prefix = prefix_driver.prefix
        relays.append(Relay(manager_over(driver, outbox_url), batch=25, sleep=0.02))
    dispatcher = manager_over(prefix_driver, outbox_url)
    for relay in relays:
        relay.start()
    try:
        texts = [f"n{i}" for i in range(1500)]
        ids = dispatch(dispatcher, outbox_url, texts, per_transaction=30)
        wait_until(lambda: sum(r.stats.relayed for r in relays) >= 1500, timeout=60, message="every row relayed")
    finally:
        for relay in relays:
            relay.stop()
        for relay in relays:
            assert relay.join(10)
    assert sum(r.stats.relayed for r in relays) == 1500, [r.stats for r in relays]
    assert prefix_driver.size("default") == 1500
    assert sorted(job.id for job in take(prefix_driver, 1500)) == sorted(i for i in ids if i)
    clean_redis(prefix_driver)
    for relay in relays:
        relay.manager.close()
    dispatcher.close()


def _wait_for(driver: BaseQueue, n: int, timeout: float) -> None:
    wait_until(lambda: driver.size("default") >= n, timeout=timeout, message=f"{n} job(s) on {driver.describe()}")


def test_a_relay_on_postgresql_wakes_on_the_commit(pg_outbox_url: str, redis_target: BaseQueue) -> None:
    manager = manager_over(redis_target, pg_outbox_url)
    dispatch(manager, pg_outbox_url, ["before"])
    relay = Relay(manager, sleep=60)
    relay.start()
    try:
        _wait_for(redis_target, 1, timeout=10)  # its first look
        started = time.monotonic()
        dispatch(manager, pg_outbox_url, ["after"])
        _wait_for(redis_target, 2, timeout=10)
        assert time.monotonic() - started < 10, "woken by the NOTIFY, long before its 60 s sleep"
    finally:
        relay.stop()
        assert relay.join(10)
    manager.close()


@pytest.mark.parametrize("which", ["sqlite", "mysql", "pgbouncer"])
def test_a_relay_polls_where_it_cannot_listen(
    request: pytest.FixtureRequest, which: str, redis_target: BaseQueue
) -> None:
    if which == "pgbouncer":
        from tests.drivers.database.support import pgbouncer_url

        url = pgbouncer_url(request)
    else:
        url = str(request.getfixturevalue({"sqlite": "sqlite_outbox_url", "mysql": "my_outbox_url"}[which]))
    manager = manager_over(redis_target, url)
    assert manager.outbox is not None and not manager.outbox.listens
    relay = Relay(manager, sleep=0.05)
    relay.start()
    try:
        dispatch(manager, _caller_url(url) if which == "pgbouncer" else url, ["polled"])
        _wait_for(redis_target, 1, timeout=10)
    finally:
        relay.stop()
        assert relay.join(10)
    assert relay.stats.relayed == 1
    manager.close()


def _caller_url(url: str) -> str:
    """The caller's own URL for a database the outbox reaches through pgbouncer."""
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "listen"]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


# -- unique jobs ---------------------------------------------------------------------------------


def unique_manager(target: BaseQueue, url: str) -> QueueManager:
    return manager_over(target, url, locks=DatabaseLockStore.from_url(url))


def run_all(manager: QueueManager, n: int) -> None:
    """A worker runs what is queued: a unique job's lock goes when it succeeds."""
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    assert stats.processed == n


def send_unique(manager: QueueManager, url: str, key: str, *, commit: bool = True) -> str | None:
    with closing(raw_connection(url)) as conn:
        sent = manager.pending(OnlyOne(key)).within(conn).send()
        conn.commit() if commit else conn.rollback()
    return sent


def test_a_unique_job_takes_its_lock_when_relayed(outbox_url: str, redis_target: BaseQueue) -> None:
    manager = unique_manager(redis_target, outbox_url)
    assert send_unique(manager, outbox_url, "a", commit=False) is not None
    assert manager.outbox is not None and manager.outbox.size() == 0
    # A rolled-back dispatch took no lock: the next one is not mistaken for its duplicate.
    first = send_unique(manager, outbox_url, "a")
    second = send_unique(manager, outbox_url, "a")  # before the relay: only the relay can tell
    assert first and second and first != second
    relay = Relay(manager)
    relay.run_once()
    assert (relay.stats.relayed, relay.stats.duplicates) == (1, 1)
    assert send_unique(manager, outbox_url, "a") is None, "its lock is held: dropped at dispatch"
    run_all(manager, 1)
    assert ran == ["only a"]
    assert send_unique(manager, outbox_url, "a") is not None, "it ran: its lock is free again"
    manager.close()


def test_a_unique_job_published_again_after_a_relay_died_is_dropped_once_it_ran(
    outbox_url: str, redis_target: BaseQueue
) -> None:
    manager = unique_manager(redis_target, outbox_url)
    send_unique(manager, outbox_url, "b")
    dispatch(manager, outbox_url, ["plain"])
    left = rows(outbox_url)
    relay = Relay(manager)
    relay.run_once()
    run_all(manager, 2)
    assert sorted(ran) == ["only b", "plain"]
    put_back(outbox_url, left)  # as if the relay had died after publishing, before deleting
    relay.run_once()
    assert relay.stats.duplicates == 1, "the unique job ran already: its copy is dropped"
    assert [job.payload for job in take(redis_target, 1)] == [{"text": "plain"}], "at least once: published again"
    manager.close()


def test_a_unique_job_published_again_before_it_ran_is_published_again(
    pg_outbox_url: str, redis_target: BaseQueue
) -> None:
    """The relay cannot tell a copy it published from one it did not: while the
    lock it took stands, the job goes out again (at least once)."""
    manager = unique_manager(redis_target, pg_outbox_url)
    send_unique(manager, pg_outbox_url, "c")
    left = rows(pg_outbox_url)
    relay = Relay(manager)
    relay.run_once()
    put_back(pg_outbox_url, left)
    relay.run_once()
    assert relay.stats.duplicates == 0
    assert [job.payload for job in take(redis_target, 2)] == [{"key": "c"}, {"key": "c"}]
    manager.close()


# -- what the relay leaves alone -----------------------------------------------------------------


def test_a_job_its_connection_refuses_is_set_aside(sqlite_outbox_url: str, sqs_target: BaseQueue) -> None:
    manager = manager_over(sqs_target, sqlite_outbox_url)
    path = sqlite_outbox_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as conn, conn:
        manager.pending(Note("before")).within(conn).send()
        manager.pending(Note("x" * 1_100_000)).within(conn).send()  # more than an SQS message holds
        manager.pending(Note("nowhere")).on_queue("nowhere").within(conn).send()  # no URL for that queue
        manager.pending(Note("after")).within(conn).send()
    relay = Relay(manager)
    assert relay.run_once() == 2
    assert relay.stats.refused == 2
    assert sorted(job.payload["text"] for job in take(sqs_target, 2)) == ["after", "before"]
    outbox = manager.outbox
    assert outbox is not None and outbox.size() == 0
    refused = outbox.refused()
    assert [why.split(": ", 1)[0] for _, _, _, why in refused] == ["connection 'fast' (sqs) refused it"] * 2
    assert "SQS takes at most" in refused[0][3] and "nowhere" in refused[1][3]
    assert relay.run_once() == 0, "set aside: never taken again"
    manager.close()


def test_a_connection_that_is_down_waits_while_the_others_go_on(
    sqlite_outbox_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from rainier_sync.drivers import RedisQueue

    up = make_redis(redis_url)
    down = RedisQueue.from_url(f"redis://127.0.0.1:{free_port()}/0", connect_timeout_ms=200, response_timeout_ms=200)
    manager = QueueManager(
        connections={"up": up, "down": down}, default="up", registry=registry(),
        outbox=Outbox.from_url(sqlite_outbox_url),
    )  # fmt: skip
    with closing(sqlite3.connect(sqlite_outbox_url.removeprefix("sqlite:///"))) as conn, conn:
        for i in range(3):
            manager.pending(Note(f"down {i}")).on_connection("down").within(conn).send()
            manager.pending(Note(f"up {i}")).within(conn).send()
    relay = Relay(manager)
    with caplog.at_level(logging.WARNING, "rainier_sync"), pytest.raises(QueueUnavailableError) as caught:
        relay.run_once()
    assert "connection 'down'" in str(caught.value) and "did not take 3 job(s)" in str(caught.value)
    assert [job.payload["text"] for job in take(up, 3)] == ["up 0", "up 1", "up 2"]
    outbox = manager.outbox
    assert outbox is not None and outbox.size("down") == 3 and outbox.size("up") == 0
    assert any("stay in the outbox" in message for message in caplog.messages)
    clean_redis(up)
    manager.close()


def test_rows_for_a_connection_this_manager_does_not_declare_are_left(
    sqlite_outbox_url: str, redis_target: BaseQueue, caplog: pytest.LogCaptureFixture
) -> None:
    from rainier_sync.drivers import MemoryQueue

    other = QueueManager(
        connections={"elsewhere": MemoryQueue()}, registry=registry(), outbox=Outbox.from_url(sqlite_outbox_url)
    )
    with closing(sqlite3.connect(sqlite_outbox_url.removeprefix("sqlite:///"))) as conn, conn:
        other.pending(Note("for elsewhere")).within(conn).send()
    manager = manager_over(redis_target, sqlite_outbox_url)
    with caplog.at_level(logging.WARNING, "rainier_sync"):
        assert Relay(manager).run_once() == 0
    assert any("connection 'elsewhere', which this manager does not declare" in m for m in caplog.messages)
    assert other.outbox is not None and other.outbox.size("elsewhere") == 1
    assert Relay(other).run_once() == 1
    manager.close()
    other.close()


def test_a_relay_stops_from_another_thread_while_it_waits(pg_outbox_url: str, redis_target: BaseQueue) -> None:
    relay = Relay(manager_over(redis_target, pg_outbox_url), sleep=60)
    thread = relay.start()
    wait_until(lambda: relay._listener is not None, timeout=10, message="the relay to listen")
    stopped = threading.Event()
    threading.Thread(target=lambda: (relay.stop(), stopped.set())).start()
    assert stopped.wait(5) and relay.join(5) and not thread.is_alive()
    relay.manager.close()
