"""Texts a database cannot hold as they are (a NUL in PostgreSQL text, a lone
surrogate anywhere): a payload holding a NUL round-trips, a column holding one
is refused at dispatch by name, and a failed record holding one is stored
escaped, so it never costs the other jobs of its worker's round their settlement."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import pytest

from rainier_sync import (
    Container,
    Job,
    JobContext,
    JobRegistry,
    QueuedJob,
    QueueManager,
    Worker,
    WorkerOptions,
    signals,
)
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.errors import PayloadError

from .test_unreadable import insert_raw


@dataclass
class Carries(Job):
    """Succeeds, recording what it carried; raises an error holding it when ``fail``."""

    NAME = "dbtest.carries"
    TRIES = 1

    n: int = 0
    text: str = ""
    fail: bool = False
    ran: ClassVar[list[tuple[int, str]]] = []

    def handle(self, context: JobContext) -> None:
        if self.fail:
            raise ValueError(f"broke on {self.text}")
        Carries.ran.append((self.n, self.text))


@pytest.fixture
def operation_failures() -> Iterator[list[str]]:
    heard: list[str] = []

    def record(sender: object, **kwargs: Any) -> None:
        heard.append(f"{kwargs['operation']}: {kwargs['error']}")

    signals.queue_operation_failed.connect(record)
    yield heard
    signals.queue_operation_failed.disconnect(record)


def manager_of(queue: DatabaseQueue) -> QueueManager:
    return QueueManager({"db": queue}, registry=JobRegistry().with_job(Carries), container=Container())


def test_a_round_whose_failed_job_raised_an_error_holding_a_nul_settles_every_job(
    pg_url: str, operation_failures: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    Carries.ran.clear()
    queue = DatabaseQueue.from_url(pg_url)
    manager = manager_of(queue)
    manager.dispatch_many([Carries(n) for n in range(10)])
    bad = manager.dispatch(Carries(99, text="a\x00b", fail=True))
    with caplog.at_level(logging.WARNING, logger="rainier_sync"):
        stats = Worker(manager, options=WorkerOptions(once=True, concurrency=11, sleep=0.05)).run()
    # A settle that fails is reported, and a --once run gives up on a backend that keeps failing.
    assert operation_failures == []
    assert sorted(n for n, _ in Carries.ran) == list(range(10)), "each of the ten ran exactly once"
    assert (stats.processed, stats.failed) == (10, 1)
    assert queue.size() == 0
    [failed] = queue.failed_jobs()
    assert failed.id == bad
    assert failed.error == "ValueError: broke on a\\u0000b [stored escaped: NUL as \\u0000 in its error]"
    assert failed.exception.message == "broke on a\x00b", "the exception record keeps the message as it was"
    assert failed.payload == {"n": 99, "text": "a\x00b", "fail": True}
    said = [r.getMessage() for r in caplog.records if "goes to the failed store with" in r.getMessage()]
    assert said == [f"job {bad} (dbtest.carries) goes to the failed store with NUL as \\u0000 in its error: "
                    "postgresql text cannot hold it as it was"]
    # Retried, the job runs again from its body as it was.
    assert queue.retry_failed(bad) is True
    [again] = queue.reserve_many(["default"], 5)
    assert again.payload["text"] == "a\x00b"
    queue.close()


def envelope_named(job_id: str, name: str, tries: int) -> str:
    from rainier_sync.types import encode

    return encode({"id": job_id, "name": name, "queue": "default", "payload": {}, "max_attempts": tries})


@pytest.mark.parametrize("how", ["unknown-name", "worker-lost"])
def test_a_stored_job_whose_name_holds_a_nul_is_failed_once(
    pg_url: str, operation_failures: list[str], how: str
) -> None:
    # Its name column is plain; the envelope's name (JSON: "\u0000") is what the worker reads.
    # "worker-lost": stored with its one attempt spent, as a worker that died leaves it.
    attempts = 1 if how == "worker-lost" else 0
    insert_raw(pg_url, "odd", envelope_named("odd", "dbtest.a\x00b", 1), attempts, 0, 1.0)
    queue = DatabaseQueue.from_url(pg_url)
    stats = Worker(manager_of(queue), options=WorkerOptions(once=True, concurrency=1, sleep=0.05)).run()
    assert operation_failures == []
    assert stats.failed == 1
    assert queue.size() == 0, "failed for good: nothing left to reclaim and run again"
    [failed] = queue.failed_jobs()
    assert failed.id == "odd"
    assert failed.name == "dbtest.a\\u0000b" and failed.job is not None and failed.job.name == "dbtest.a\x00b"
    assert "NUL as \\u0000 in its name" in failed.error
    said = "worker lost during attempt 1 of 1"
    if how == "unknown-name":
        said = "no job named 'dbtest.a\\x00b' is registered"
    assert said in failed.error, failed.error
    assert queue.reclaim_expired() == 0 and queue.reserve_many(["default"], 5) == []
    queue.close()


def test_a_failed_record_holding_a_lone_surrogate_is_stored_escaped(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    queue.push(QueuedJob(id="j1", name="dbtest.x", queue="default", payload={}, max_attempts=1))
    [job] = queue.reserve_many(["default"], 1)
    queue.fail(job, ValueError("no such file: /tmp/\udcff"))
    [failed] = queue.failed_jobs()
    assert failed.error == (
        "ValueError: no such file: /tmp/\\udcff [stored escaped: a lone surrogate as its \\uXXXX escape in its error]"
    )
    assert failed.exception.message == "no such file: /tmp/\udcff", "the exception record keeps it as it was"
    queue.close()


@pytest.mark.parametrize("path", ["push", "push_many", "push_within", "dispatch"])
def test_a_payload_holding_a_nul_round_trips(db_url: str, path: str) -> None:
    Carries.ran.clear()
    queue = DatabaseQueue.from_url(db_url)
    job = QueuedJob(id="j1", name="dbtest.carries", queue="default", payload={"n": 1, "text": "a\x00b", "fail": False})
    if path == "push":
        queue.push(job)
    elif path == "push_many":
        queue.push_many([job])
    elif path == "dispatch":
        manager_of(queue).dispatch(Carries(1, text="a\x00b"))
    else:
        if queue.dialect != "postgresql":
            pytest.skip("the caller's connection is exercised on PostgreSQL here")
        import psycopg

        with psycopg.connect(db_url) as conn:
            queue.push_within(conn, [job])
    [back] = queue.reserve_many(["default"], 1)
    assert back.payload == {"n": 1, "text": "a\x00b", "fail": False}
    queue.close()


@pytest.mark.parametrize("column", ["name", "id"])
@pytest.mark.parametrize("path", ["push", "push_many", "push_stream"])
def test_a_column_holding_a_nul_is_refused_at_dispatch_by_name_on_postgresql(
    pg_url: str, column: str, path: str
) -> None:
    fields: dict[str, Any] = {"id": "j1", "name": "dbtest.x", column: f"{column}\x00x"}
    job = QueuedJob(queue="default", payload={}, **fields)
    queue = DatabaseQueue.from_url(pg_url)
    said = f"refused a value of job {job.id!r}: its {column} '{column}\\x00x' holds a NUL character"
    with pytest.raises(PayloadError, match=said.replace("\\", "\\\\")):
        fine = QueuedJob(id="ok", name="dbtest.x", queue="default", payload={})
        if path == "push_many":
            queue.push_many([fine, job])
        elif path == "push_stream":
            queue.push_stream(iter([[fine], [job]]))
        else:
            queue.push(job)
    assert queue.size() == 0
    queue.close()


@dataclass
class FarAway(Job):
    """A chain's catch on a queue longer than MariaDB's 191 characters: refused when handed over."""

    NAME = "dbtest.far-away"
    QUEUE = "q" * 300

    def handle(self, context: JobContext) -> None:
        pass


def test_a_failure_whose_record_the_database_refuses_costs_the_rest_of_its_round_nothing(
    my_url: str, operation_failures: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    Carries.ran.clear()
    queue = DatabaseQueue.from_url(my_url)
    registry = JobRegistry().with_job(Carries).with_job(FarAway)
    manager = QueueManager({"db": queue}, registry=registry, container=Container(), locks=queue.lock_store())
    manager.dispatch_many([Carries(n) for n in range(10)])
    manager.chain([Carries(99, fail=True), Carries(100)]).catch(FarAway()).dispatch()
    with caplog.at_level(logging.WARNING, logger="rainier_sync"):
        stats = Worker(manager, options=WorkerOptions(once=True, concurrency=11, sleep=0.05)).run()
    assert sorted(n for n, _ in Carries.ran) == list(range(10)), "each of the ten ran exactly once"
    assert stats.processed == 10
    # The refused one alone is reported, and stays reserved: nothing of it is lost.
    [refused] = operation_failures
    assert refused.startswith("settle: rainier_sync.errors.PayloadError: ") and "queue" in refused, refused
    assert any("could not be settled (failed); it stays reserved" in r.getMessage() for r in caplog.records)
    counts = queue.counts("default")
    assert (counts.ready, counts.reserved) == (0, 1)
    assert queue.failed_count() == 0
    queue.close()
