"""Outages on the real servers, made by a TCP proxy each test owns (never by
stopping the shared servers): deadlines written after a reconnect, outages
that reach the caller as QueueUnavailableError within a bound, and a frozen
server that cannot hang a caller."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.errors import ConfigurationError, QueueUnavailableError
from rainier_sync.types import QueuedJob
from tests.support import free_port, wait_until

from .proxy import TcpProxy, proxy_for, through


@pytest.fixture(params=["postgres", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """A migrated, empty database on each server dialect."""
    return str(request.getfixturevalue({"postgres": "pg_url", "mysql": "my_url"}[request.param]))


@pytest.fixture
def proxy(server_url: str) -> Iterator[TcpProxy]:
    with proxy_for(server_url) as made:
        yield made


def jobs(prefix: str, n: int) -> list[QueuedJob]:
    return [
        QueuedJob(id=f"{prefix}{i}", name="x", queue="default", payload={}, available_at=float(i)) for i in range(n)
    ]


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread; the dict gets its ``result`` or ``error``."""
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, out


def reservations(url: str) -> dict[str, float]:
    direct = DatabaseQueue.from_url(url)
    try:
        rows = direct._backend.query("SELECT id, reserved_until FROM rainier_jobs WHERE reserved_at IS NOT NULL")
        return {str(job_id): float(until) for job_id, until in rows}
    finally:
        direct.close()


# -- A: deadlines are written from when the statement ran, not from before the reconnect ---------


def test_claims_and_heartbeats_across_an_outage_longer_than_the_reservation_reserve_from_after_it(
    server_url: str, proxy: TcpProxy
) -> None:
    reservation = 2.0
    queue = DatabaseQueue.from_url(through(server_url, proxy), reservation=reservation, reconnect_for=60)
    queue.push_many(jobs("j", 6))
    held = queue.reserve_many(["default"], 3)
    assert len(held) == 3
    locks = queue.lock_store()
    proxy.cut()
    heartbeat, beat = in_thread(lambda: queue.extend(held))
    claim, claimed = in_thread(lambda: queue.reserve_many(["default"], 3))
    lock, locked = in_thread(lambda: locks.acquire("unique-key", "me", reservation))
    # The outage lasts longer than the reservation: every call waits it out, reconnecting.
    time.sleep(reservation + 1.0)
    assert heartbeat.is_alive() and claim.is_alive() and lock.is_alive()
    healed_at = time.time()
    proxy.heal()
    for thread in (heartbeat, claim, lock):
        thread.join(60)
    assert "error" not in beat and "error" not in claimed and "error" not in locked, (beat, claimed, locked)
    assert len(claimed["result"]) == 3 and locked["result"] is True
    until = reservations(server_url)
    assert sorted(until) == [f"j{i}" for i in range(6)]
    stale = {job_id: round(healed_at + reservation - value, 2) for job_id, value in until.items()}
    assert all(value >= healed_at + reservation for value in until.values()), (
        f"seconds short of a full reservation from when the database answered again: {stale}"
    )
    rival = DatabaseQueue.from_url(server_url, reservation=reservation)
    assert rival.reclaim_expired() == 0, "a reservation written after the outage must not be lapsed already"
    assert rival.lock_store().owner("unique-key") == "me", "a lock taken after the outage must not be expired already"
    (expires,) = rival._backend.query("SELECT expires_at FROM rainier_locks WHERE lock_key = 'unique-key'")[0]
    assert expires >= healed_at + reservation
    rival.close()
    queue.close()


ledger: list[str] = []
release_jobs = threading.Event()
started: list[str] = []


@dataclass
class Held(Job):
    """Runs until the test lets it finish."""

    NAME = "dbtest.held"
    TRIES = 5

    n: int

    def handle(self, context: JobContext) -> None:
        started.append(str(self.n))
        assert release_jobs.wait(120), "the test never let the job finish"
        ledger.append(str(self.n))


def test_a_worker_through_an_outage_longer_than_the_reservation_runs_each_job_once(
    server_url: str, proxy: TcpProxy
) -> None:
    ledger.clear()
    started.clear()
    release_jobs.clear()
    reservation = 2.0
    queue = DatabaseQueue.from_url(through(server_url, proxy), reservation=reservation, reconnect_for=60)
    manager = QueueManager(connections={"db": queue}, registry=JobRegistry().with_job(Held), container=Container())
    for n in range(4):
        manager.dispatch(Held(n))
    worker = Worker(manager, options=WorkerOptions(concurrency=4, prefetch=0, sleep=0.1))
    worker.start()
    sweeper = DatabaseQueue.from_url(server_url, reservation=reservation)
    try:
        wait_until(lambda: len(started) == 4, timeout=30, message="every job to start")
        proxy.cut()  # the worker's next heartbeat meets the outage, and waits it out reconnecting
        time.sleep(reservation + 1.0)
        proxy.heal()
        # Another process sweeps lapsed reservations as soon as the database is back:
        # the heartbeat that rode out the outage must have renewed them from then.
        sweep_until = time.monotonic() + reservation + 1.0
        while time.monotonic() < sweep_until:
            sweeper.reclaim_expired()
            time.sleep(0.05)
        release_jobs.set()
        # Each run is in the ledger before its row is deleted: drained means every run is counted.
        wait_until(lambda: sweeper.size() == 0, timeout=60, message="the queue to drain")
    finally:
        release_jobs.set()
        worker.stop()
        worker.join(60)
        sweeper.close()
        manager.close()
    assert sorted(ledger) == ["0", "1", "2", "3"], f"ran: {sorted(ledger)}"


# -- C: outages reach the caller as QueueUnavailableError, within a bound -------------------------


def test_a_cut_connection_reaches_dispatch_as_queue_unavailable_within_reconnect_for(
    server_url: str, proxy: TcpProxy
) -> None:
    queue = DatabaseQueue.from_url(through(server_url, proxy), reconnect_for=1)
    queue.push(jobs("before", 1)[0])
    proxy.cut()
    started_at = time.monotonic()
    with pytest.raises(QueueUnavailableError, match=f"127.0.0.1:{proxy.port}") as caught:
        queue.push(jobs("during", 1)[0])
    took = time.monotonic() - started_at
    assert took < 15, f"gave up after {took:.1f}s with reconnect_for=1"
    assert "reconnect_for" in str(caught.value)
    proxy.heal()
    queue.push(jobs("after", 1)[0])  # back by itself once the database answers
    assert {job.id for job in queue.reserve_many(["default"], 5)} == {"before0", "after0"}
    queue.close()


@pytest.mark.parametrize("operation", ["dispatch", "claim"])
def test_a_frozen_server_cannot_hang_a_caller(server_url: str, proxy: TcpProxy, operation: str) -> None:
    queue = DatabaseQueue.from_url(
        through(server_url, proxy) + ("&" if "?" in server_url else "?") + "connect_timeout=2",
        reconnect_for=1,
        response_timeout=1,
    )
    queue.push(jobs("before", 1)[0])
    assert len(queue.reserve_many(["default"], 1)) == 1  # the claiming connection is open too
    proxy.freeze()  # connected, and nothing ever answers: a stopped server process
    call: Callable[[], Any] = (
        (lambda: queue.push(jobs("during", 1)[0]))
        if operation == "dispatch"
        else (lambda: queue.reserve_many(["default"], 5))
    )
    started_at = time.monotonic()
    thread, out = in_thread(call)
    thread.join(60)
    assert not thread.is_alive(), f"{operation} still waiting on a frozen server after 60 s"
    took = time.monotonic() - started_at
    error = out.get("error")
    assert isinstance(error, QueueUnavailableError), out
    assert f"127.0.0.1:{proxy.port}" in str(error) and "did not answer" in str(error)
    assert took < 20, f"gave up after {took:.1f}s (response_timeout=1, reconnect_for=1, connect_timeout=2)"
    proxy.heal()
    queue.close()


def test_the_bounds_come_from_the_url_too(server_url: str, proxy: TcpProxy) -> None:
    url = through(server_url, proxy) + ("&" if "?" in server_url else "?") + "reconnect_for=1&response_timeout=1"
    queue = DatabaseQueue.from_url(url)
    proxy.cut()
    started_at = time.monotonic()
    with pytest.raises(QueueUnavailableError):
        queue.size()
    assert time.monotonic() - started_at < 15
    queue.close()


def test_a_refused_connection_at_construction_is_queue_unavailable_naming_the_server(server_url: str) -> None:
    port = free_port()
    scheme = "postgresql" if server_url.startswith("postgres") else "mysql"
    user = "postgres" if scheme == "postgresql" else "root"
    with pytest.raises(QueueUnavailableError, match=f"127.0.0.1:{port}/test") as caught:
        DatabaseQueue.from_url(f"{scheme}://{user}@127.0.0.1:{port}/test")
    assert not isinstance(caught.value, ConfigurationError)


def test_a_database_that_does_not_exist_is_a_configuration_error(server_url: str) -> None:
    scheme = "postgresql" if server_url.startswith("postgres") else "mysql"
    user = "postgres" if scheme == "postgresql" else "root"
    port = 5432 if scheme == "postgresql" else 3306
    with pytest.raises(ConfigurationError, match="rainier_no_such_database"):
        DatabaseQueue.from_url(f"{scheme}://{user}@127.0.0.1:{port}/rainier_no_such_database")


@pytest.mark.parametrize("option, value", [("reconnect_for", "-1"), ("response_timeout", "soon")])
def test_bad_bounds_are_refused(server_url: str, option: str, value: str) -> None:
    url = server_url + ("&" if "?" in server_url else "?") + f"{option}={value}"
    with pytest.raises(ConfigurationError, match=f"{option}={value!r}"):
        DatabaseQueue.from_url(url)


def test_the_default_bounds_keep_an_outage_well_under_a_minute(pg_url: str, my_url: str) -> None:
    for url in (pg_url, my_url):
        queue = DatabaseQueue.from_url(url)
        db = queue._backend.db
        assert (db.reconnect_for, db.response_timeout) == (10, 10)
        assert db.give_up_after == 35  # 10 + 10 + 5 (connect_timeout) + 10
        queue.close()
