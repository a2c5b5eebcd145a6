"""The commands: ``queue:migrate`` creates the outbox table, ``outbox:relay``
relays (once, or until SIGTERM, finishing its batch), ``queue:work --relay``;
and a relay killed with SIGKILL ten times during 10,000 dispatches loses none."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Iterator

import pytest

from rainier_sync import QueueManager
from rainier_sync.cli import EXIT_OK, EXIT_USAGE, main
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.outbox import Outbox
from tests.support import wait_until

from .conftest import clean_redis, make_redis
from .jobs import Note, ran
from .relay_app import make_manager
from .test_dispatch import raw_connection

ROOT = Path(__file__).resolve().parents[2]
APP = "--app=tests.outbox.relay_app:make_manager"


@pytest.fixture
def redis_driver(redis_url: str) -> Iterator[Any]:
    driver = make_redis(redis_url)
    yield driver
    clean_redis(driver)
    driver.close()


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, redis_driver: Any) -> dict[str, str]:
    env = {"REDIS_URL": redis_url, "REDIS_PREFIX": redis_driver.prefix}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_queue_migrate_creates_the_outbox_table(
    tmp_path: Path, app_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.db"
    monkeypatch.setenv("OUTBOX_URL", f"sqlite:///{path}")
    assert main(["queue:migrate", APP]) == EXIT_OK
    out = capsys.readouterr().out
    assert "fast (redis): nothing to migrate" in out
    assert f"outbox ({path}): applied migration(s) 1, 2, 3, 4, 5" in out
    assert main(["queue:migrate", APP]) == EXIT_OK
    assert f"outbox ({path}): already up to date" in capsys.readouterr().out
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM rainier_outbox").fetchone() == (0,)


def dispatch_sqlite(url: str, texts: list[str]) -> None:
    manager = make_manager()
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
        for text in texts:
            manager.pending(Note(text)).within(conn).send()
    manager.close()


def test_outbox_relay_once_and_queue_work_relay(
    sqlite_outbox_url: str, app_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, redis_driver: BaseQueue,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setenv("OUTBOX_URL", sqlite_outbox_url)
    dispatch_sqlite(sqlite_outbox_url, ["a", "b"])
    assert main(["outbox:relay", "--once", APP]) == EXIT_OK
    assert "outbox relay: 2 job(s) relayed to fast" in caplog.messages
    assert redis_driver.size("default") == 2
    dispatch_sqlite(sqlite_outbox_url, ["c"])
    ran.clear()
    assert main(["queue:work", "--once", "--relay", APP]) == EXIT_OK
    assert sorted(ran) == ["a", "b", "c"]


def test_outbox_relay_without_an_outbox_is_bad_usage(
    app_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["outbox:relay", "--app=tests.outbox.relay_app:without_outbox"]) == EXIT_USAGE
    assert "declares no outbox, so there is nothing to relay" in capsys.readouterr().err
    assert main(["queue:work", "--once", "--relay", "--app=tests.outbox.relay_app:without_outbox"]) == EXIT_USAGE
    assert "declares no outbox, so there is nothing to relay" in capsys.readouterr().err


def relay_process(env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rainier_sync", "outbox:relay", APP, "--sleep", "0.05", *extra],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.processes
def test_outbox_relay_stops_on_sigterm_once_its_batch_is_published(
    pg_outbox_url: str, app_env: dict[str, str], redis_driver: BaseQueue
) -> None:
    env = {**app_env, "OUTBOX_URL": pg_outbox_url}
    dispatcher = QueueManager(connections={"fast": redis_driver}, outbox=Outbox.from_url(pg_outbox_url))
    process = relay_process(env)
    try:
        with closing(raw_connection(pg_outbox_url)) as conn:
            dispatcher.pending(Note("relayed by the process")).within(conn).send()
            conn.commit()
        wait_until(lambda: redis_driver.size("default") == 1, timeout=20, message="the relay process to relay")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0, err
    assert "outbox relay stopped: 1 relayed, 0 duplicate(s) dropped, 0 refused" in err


# -- a relay killed mid-batch ------------------------------------------------------------------------

KILLS = 10
JOBS = 10_000
PER_TRANSACTION = 100
BATCH = 50


@pytest.mark.processes
@pytest.mark.parametrize("which", ["postgresql", "sqlite"])
def test_a_relay_killed_ten_times_during_ten_thousand_dispatches_loses_none(
    request: pytest.FixtureRequest, which: str, app_env: dict[str, str], redis_driver: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """SIGKILL lands between a batch's push and its delete, or anywhere else:
    every committed job reaches Redis, none of a rolled-back transaction does,
    and the duplicates are at most one batch per kill (the documented bound).
    About 10 s per database (10,000 dispatches, a relay process started 11 times); PostgreSQL
    and SQLite, whose relays hold their rows in the two ways (row locks, claims)."""
    url = str(request.getfixturevalue("pg_outbox_url" if which == "postgresql" else "sqlite_outbox_url"))
    env = {**app_env, "OUTBOX_URL": url, "OUTBOX_LEASE": "1"}
    monkeypatch.setenv("OUTBOX_URL", url)
    dispatcher = QueueManager(connections={"fast": redis_driver}, outbox=Outbox.from_url(url))
    committed: list[str] = []
    kills = 0
    failure: list[BaseException] = []

    def dispatch() -> None:
        try:
            with closing(raw_connection(url)) as conn:
                for t in range(JOBS // PER_TRANSACTION):
                    deadline = time.monotonic() + 30
                    while kills < t * KILLS // (JOBS // PER_TRANSACTION) and time.monotonic() < deadline:
                        time.sleep(0.005)  # spread the dispatches over the kills
                    ids = [dispatcher.pending(Note(f"{t}.{i}")).within(conn).send() for i in range(PER_TRANSACTION)]
                    conn.commit()
                    committed.extend(i for i in ids if i)
                    if t % 10 == 5:  # and a transaction that rolls back, now and then
                        dispatcher.pending(Note("rolled back")).within(conn).send()
                        conn.rollback()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)

    rng = random.Random(19)
    process = relay_process(env, "--batch", str(BATCH))
    dispatching = threading.Thread(target=dispatch)
    dispatching.start()
    try:
        for _ in range(KILLS):
            # Once this relay is publishing (its start-up is most of its life otherwise), mid-stream.
            seen = redis_driver.size("default")
            wait_until(lambda s=seen: redis_driver.size("default") > s, timeout=30, message="the relay to publish")
            time.sleep(rng.uniform(0.0, 0.2))
            process.kill()
            process.wait(10)
            kills += 1
            process = relay_process(env, "--batch", str(BATCH))
        dispatching.join(60)
        assert not dispatching.is_alive() and not failure, failure
        outbox = dispatcher.outbox
        assert outbox is not None
        wait_until(lambda: outbox.size() == 0, timeout=60, message="the last relay to drain the outbox")
    finally:
        kills = KILLS
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert len(committed) == JOBS
    received: list[str] = []
    texts: set[str] = set()
    while got := redis_driver.reserve_many(["default"], 1000):
        received.extend(job.id for job in got)
        texts.update(job.payload["text"] for job in got)
        redis_driver.acknowledge_many(got)
    assert set(committed) - set(received) == set(), "a committed job was lost"
    assert set(received) == set(committed) and "rolled back" not in texts
    duplicates = len(received) - len(set(received))
    assert duplicates <= KILLS * BATCH, duplicates
    dispatcher.close()
