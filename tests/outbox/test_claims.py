"""SQLite's claims: a relay holds the rows it took for as long as it publishes
them, however slow a push; it settles only rows it still holds; and a row's
``seq`` is never given again."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from typing import Any, Sequence

import pytest

from rainier_sync import QueueManager, _clock
from rainier_sync.drivers import RedisQueue
from rainier_sync.errors import QueueUnavailableError
from rainier_sync.outbox import Outbox, Relay
from rainier_sync.types import QueuedJob
from tests.support import free_port

from .conftest import clean_redis, make_redis
from .jobs import Note, registry


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def dispatch(manager: QueueManager, url: str, n: int) -> None:
    with closing(sqlite3.connect(sqlite_path(url))) as conn, conn:
        for i in range(n):
            manager.pending(Note(f"n{i}")).within(conn).send()


class SlowRedis(RedisQueue):
    """A push that takes as long as the test says (a slow server, a long reconnect)."""

    started: threading.Event
    finish: threading.Event

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        self.started.set()
        assert self.finish.wait(20), "the test never let the push finish"
        return super().push_many(jobs)


def test_a_push_slower_than_the_lease_keeps_its_rows(sqlite_outbox_url: str, redis_url: str) -> None:
    """While relay A's push outlasts the lease (1 s) twice over, relay B finds
    nothing to take: A's claim is renewed as it publishes. 20 jobs reach Redis once."""
    fast = make_redis(redis_url)
    slow = SlowRedis.from_url(redis_url, prefix=fast.prefix)
    slow.started, slow.finish = threading.Event(), threading.Event()

    def manager(driver: Any) -> QueueManager:
        return QueueManager(
            connections={"fast": driver}, registry=registry(), outbox=Outbox(sqlite_outbox_url, lease=1.0)
        )

    a, b = manager(slow), manager(fast)
    dispatch(a, sqlite_outbox_url, 20)
    relayed: list[int] = []
    thread = threading.Thread(target=lambda: relayed.append(Relay(a).run_once()))
    thread.start()
    try:
        assert slow.started.wait(10)
        taken_by_b = 0
        until = time.monotonic() + 2.5
        relay_b = Relay(b)
        while time.monotonic() < until:
            taken_by_b += relay_b.run_once()
            time.sleep(0.1)  # the lease must pass: this test is about time
    finally:
        slow.finish.set()
        thread.join(20)
    assert taken_by_b == 0 and relayed == [20]
    assert fast.size("default") == 20
    clean_redis(fast)
    a.close()
    b.close()


def test_a_relay_settles_only_the_rows_it_still_holds(
    sqlite_outbox_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relay A stalls past its lease (a paused process: its claim lapses, its
    clock moves on); relay B takes its rows over and, its Redis down, lets them
    go. A's late word on them changes nothing: they are neither deleted nor set
    aside, and A's renewal before its push says it holds none."""
    up = make_redis(redis_url)
    down = RedisQueue.from_url(f"redis://127.0.0.1:{free_port()}/0", connect_timeout_ms=200, response_timeout_ms=200)
    a = QueueManager(connections={"fast": up}, registry=registry(), outbox=Outbox(sqlite_outbox_url, lease=30))
    b = QueueManager(connections={"fast": down}, registry=registry(), outbox=Outbox(sqlite_outbox_url, lease=30))
    dispatch(a, sqlite_outbox_url, 3)
    outbox = a.outbox
    assert outbox is not None
    still_held: list[set[int]] = []

    def stalled(rows: list[tuple[int, str, str]], hold: Any) -> tuple[list[int], dict[int, str]]:
        with closing(sqlite3.connect(sqlite_path(sqlite_outbox_url))) as conn, conn:
            conn.execute("UPDATE rainier_outbox SET claimed_until = 0")  # A's lease lapsed
        real = _clock._REAL["monotonic"]
        monkeypatch.setitem(_clock._REAL, "monotonic", lambda: real() + 60)  # and A's time passed
        try:
            Relay(b).run_once()
        except QueueUnavailableError:
            pass  # B took the rows, could not push them, and let them go
        seqs = [seq for seq, _, _ in rows]
        still_held.append(hold(seqs))
        return seqs[:1], {seqs[1]: "refused, says A"}

    assert outbox.relay_batch(10, ["fast"], stalled) == 3
    assert still_held == [set()]
    assert outbox.size() == 3 and outbox.refused_count() == 0
    assert Relay(a).run_once() == 3
    assert up.size("default") == 3
    clean_redis(up)
    a.close()
    b.close()


def test_a_seq_is_never_given_twice(sqlite_outbox_url: str, redis_url: str) -> None:
    """The outbox emptied by a relay, the next row still gets a new number."""
    up = make_redis(redis_url)
    manager = QueueManager(connections={"fast": up}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    dispatch(manager, sqlite_outbox_url, 1)
    assert Relay(manager).run_once() == 1
    dispatch(manager, sqlite_outbox_url, 1)
    with closing(sqlite3.connect(sqlite_path(sqlite_outbox_url))) as conn:
        assert conn.execute("SELECT seq FROM rainier_outbox").fetchall() == [(2,)]
    clean_redis(up)
    manager.close()
