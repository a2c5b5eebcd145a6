"""Stored jobs nobody can read, on every dialect: each one alone goes to the
failed store with its reason, and the good jobs claimed with it are handed out
in the same claim."""

from __future__ import annotations

import sqlite3
import urllib.parse
from contextlib import closing
from typing import Any, Iterator

import pytest

from rainier_sync import signals
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.errors import PayloadError
from rainier_sync.types import QueuedJob

DEEP = "[" * 100_000 + "]" * 100_000


def envelope(job_id: str, payload: str = "{}") -> str:
    return f'{{"id":"{job_id}","name":"dbtest.x","queue":"default","payload":{payload},"max_attempts":3}}'


#: kind -> (body, attempts, priority, available_at, what the failed record says)
BAD: dict[str, tuple[Any, Any, Any, Any, str]] = {
    "not-json": ("{not json", 0, 0, 3.5, "not valid JSON"),
    "not-an-object": ("[1, 2]", 0, 0, 3.5, "must be a JSON object"),
    "missing-fields": ('{"id": "bad-missing-fields", "name": "dbtest.x"}', 0, 0, 3.5, "no 'payload' field"),
    "wrong-field-types": (envelope("bad-wrong-field-types", "[1]"), 0, 0, 3.5, "payload must be a JSON object"),
    "100000-deep": (envelope("bad-100000-deep", '{"v": ' + DEEP + "}"), 0, 0, 3.5, "nested too deeply"),
    "negative-attempts": (envelope("bad-negative-attempts"), -5, 0, 3.5, "attempt count -5"),
    "absurd-attempts": (envelope("bad-absurd-attempts"), 2_147_483_647, 0, 3.5, "attempt count"),
    "attempts-abc": (envelope("bad-attempts-abc"), "abc", 0, 3.5, "attempt count 'abc' is not a whole number"),
    "priority-x": (envelope("bad-priority-x"), 0, "x", 3.5, "priority 'x'"),
    "available-at-soon": (envelope("bad-available-at-soon"), 0, 0, "soon", "available_at 'soon'"),
    "body-not-utf8": (b"\xff\xfe{", 0, 0, 3.5, "UTF-8"),
}
BODY_UNREADABLE = {"not-json", "not-an-object", "missing-fields", "wrong-field-types", "100000-deep", "body-not-utf8"}
#: Only SQLite stores a value of another type in a typed column; the servers refuse such a row.
NOT_STORABLE_ON_SERVERS = {"priority-x", "available-at-soon", "body-not-utf8", "attempts-abc"}


def insert_raw(url: str, job_id: str, body: Any, attempts: Any, priority: Any, available_at: Any) -> None:
    """A row written beside the driver (by hand, another tool, an old release)."""
    columns = "id, queue, name, body, attempts, priority, available_at"
    if url.startswith("sqlite"):
        path = urllib.parse.urlsplit(url).path[1:]
        body_mark = "CAST(? AS TEXT)" if isinstance(body, bytes) else "?"
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute(
                f"INSERT INTO rainier_jobs ({columns}) VALUES (?, ?, ?, {body_mark}, ?, ?, ?)",
                (job_id, "default", "dbtest.x", body, attempts, priority, available_at),
            )
        return
    params = (job_id, "default", "dbtest.x", body, attempts, priority, available_at)
    sql = f"INSERT INTO rainier_jobs ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql, params)
        return
    import pymysql

    parts = urllib.parse.urlsplit(url)
    conn = pymysql.connect(
        host=parts.hostname, port=parts.port or 3306, user=parts.username or "root", database=parts.path[1:]
    )
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def good_jobs() -> list[QueuedJob]:
    return [
        QueuedJob(id=f"good{n}", name="dbtest.x", queue="default", payload={"n": n}, max_attempts=3, available_at=n)
        for n in (1, 2, 3, 5, 6, 7)
    ]


@pytest.fixture
def discarded() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(sender: object, **kw: Any) -> None:
        seen.append(kw)

    signals.queue_message_discarded.connect(record)
    yield seen
    signals.queue_message_discarded.disconnect(record)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_an_unreadable_row_alone_goes_to_the_failed_store_and_its_batch_is_handed_out(
    db_url: str, kind: str, discarded: list[dict[str, Any]]
) -> None:
    body, attempts, priority, available_at, reason = BAD[kind]
    bad_id = f"bad-{kind}"
    queue = DatabaseQueue.from_url(db_url)
    if queue.dialect != "sqlite" and kind in NOT_STORABLE_ON_SERVERS:
        queue.close()
        if kind == "body-not-utf8":
            pytest.skip("PostgreSQL and MariaDB hold only valid UTF-8 in a text column")
        with pytest.raises(Exception):  # noqa: B017 - whichever the client library raises
            insert_raw(db_url, bad_id, body, attempts, priority, available_at)
        return
    queue.push_many(good_jobs())
    insert_raw(db_url, bad_id, body, attempts, priority, available_at)

    claimed = queue.reserve_many(["default"], 20)

    assert [job.id for job in claimed] == [job.id for job in good_jobs()]
    assert all(job.attempts == 1 for job in claimed)
    failed = queue.failed_jobs()
    assert [f.id for f in failed] == [bad_id]
    assert reason in failed[0].error, failed[0].error
    assert f"job {bad_id!r}" in failed[0].error
    assert queue.size() == len(good_jobs()), "only the good jobs are left, reserved"
    assert queue.counts("default").reserved == len(good_jobs())
    assert len(discarded) == 1 and reason in discarded[0]["error"]
    # The failed store lists and retries it like any other. A retry queues its body
    # again with fresh columns: a readable body runs; an unreadable one is moved back.
    assert queue.failed_count() == 1
    assert queue.retry_failed(bad_id) is True
    again = queue.reserve_many(["default"], 5)
    if kind in BODY_UNREADABLE:
        assert again == [] and [f.id for f in queue.failed_jobs()] == [bad_id]
    else:
        assert [job.id for job in again] == [bad_id] and again[0].attempts == 1
        assert queue.failed_count() == 0
    queue.close()


def test_a_batch_of_every_kind_at_once_loses_no_good_job(db_url: str, discarded: list[dict[str, Any]]) -> None:
    queue = DatabaseQueue.from_url(db_url)
    good = [
        QueuedJob(id=f"good{n}", name="dbtest.x", queue="default", payload={}, max_attempts=3, available_at=n)
        for n in range(30)
    ]
    queue.push_many(good[:15])
    kinds = [k for k in sorted(BAD) if queue.dialect == "sqlite" or k not in NOT_STORABLE_ON_SERVERS]
    for n, kind in enumerate(kinds):
        body, attempts, priority, available_at, _ = BAD[kind]
        due = 14.5 + n / 100 if available_at == 3.5 else available_at
        insert_raw(db_url, f"bad-{kind}", body, attempts, priority, due)
    queue.push_many(good[15:])

    claimed = queue.reserve_many(["default"], 100)

    assert [job.id for job in claimed] == [job.id for job in good]
    failed = {f.id: f.error for f in queue.failed_jobs(100)}
    assert set(failed) == {f"bad-{kind}" for kind in kinds}
    for kind in kinds:
        assert BAD[kind][4] in failed[f"bad-{kind}"]
    assert len(discarded) == len(kinds)
    queue.close()


@pytest.mark.parametrize(("attempts", "said"), [("abc", "'abc'"), (2.5, "2.5"), (b"\x01", "b'\\x01'")])
def test_an_attempt_count_that_is_no_integer_is_reported_as_it_was_stored(
    sqlite_url: str, attempts: Any, said: str
) -> None:
    # SQLite keeps text, a real or a blob in an INTEGER column; the claim's count
    # must not add to it (text sorted above every number read as more than 1,000,000).
    insert_raw(sqlite_url, "bad", envelope("bad"), attempts, 0, 1.0)
    queue = DatabaseQueue.from_url(sqlite_url)
    assert queue.reserve_many(["default"], 5) == []
    [failed] = queue.failed_jobs()
    assert failed.error.endswith(f"cannot be read: its stored attempt count {said} is not a whole number"), failed.error
    queue.close()


def test_an_idle_wait_over_a_row_with_an_unreadable_due_time_does_not_fail(sqlite_url: str) -> None:
    # SQLite keeps 'soon' in a REAL column as text, which sorts after every number:
    # the row was never due, and every idle wait failed reading it as a time.
    queue = DatabaseQueue.from_url(sqlite_url)
    insert_raw(sqlite_url, "bad-soon", envelope("bad-soon"), 0, 0, "soon")
    waker = Waker()
    queue.wait_for_jobs(["default"], 0.05, waker)
    assert queue.reserve_many(["default"], 5) == []
    assert [f.id for f in queue.failed_jobs()] == ["bad-soon"]
    waker.close()
    queue.close()


# -- values the database refuses -------------------------------------------------------------------

REFUSABLE = {
    "nul-in-queue": {"queue": "mail\x00box"},
    "nul-in-id": {"id": "job\x00one"},
    "priority-beyond-int32": {"priority": 2**40},
    "priority-beyond-int64": {"priority": 2**70},
    "queue-of-300-characters": {"queue": "q" * 300},
    "lone-surrogate-in-name": {"name": "dbtest.\udc80"},
}


@pytest.mark.parametrize("case", sorted(REFUSABLE))
@pytest.mark.parametrize("many", [False, True], ids=["push", "push_many"])
def test_a_value_the_database_refuses_is_a_payload_error_never_a_client_library_error(
    db_url: str, case: str, many: bool
) -> None:
    fields: dict[str, Any] = {"id": "j1", "name": "dbtest.x", "queue": "default", **REFUSABLE[case]}
    job = QueuedJob(payload={"n": 1}, available_at=0.0, **fields)
    queue = DatabaseQueue.from_url(db_url)
    try:
        if many:
            queue.push_many([job])
        else:
            queue.push(job)
    except Exception as exc:  # noqa: BLE001 - which type it is, is the point
        assert isinstance(exc, PayloadError), f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
        assert "refused" in str(exc) and queue.describe().split("(")[1].split(":")[0] in str(exc).lower()
        assert queue.size() == 0, "nothing of a refused job is stored"
    else:
        back = queue.reserve_many([job.queue], 1)
        if back:
            assert (back[0].id, back[0].name, back[0].queue, back[0].priority) == (
                job.id,
                job.name,
                job.queue,
                job.priority,
            )
        else:
            # Stored, but past what an envelope may carry (dispatch refuses it first): unreadable, not lost.
            (failed,) = queue.failed_jobs()
            assert failed.id == job.id and "priority" in failed.error
    queue.close()


def test_a_value_refused_within_the_callers_transaction_is_a_payload_error(pg_url: str) -> None:
    import psycopg

    queue = DatabaseQueue.from_url(pg_url)
    job = QueuedJob(id="j1", name="dbtest.x", queue="mail\x00box", payload={}, available_at=0.0)
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(PayloadError, match="refused a value of job 'j1'"):
            queue.push_within(conn, [job])
        conn.rollback()
    assert queue.size() == 0
    queue.close()



def test_a_once_run_with_one_thread_goes_on_past_unreadable_rows_to_the_job_behind_them(db_url: str) -> None:
    from dataclasses import dataclass

    from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions

    ran: list[int] = []

    @dataclass
    class Behind(Job):
        NAME = "dbtest.behind"

        n: int

        def handle(self, context: JobContext) -> None:
            ran.append(self.n)

    for kind in ("100000-deep", "not-json"):
        body, attempts, priority, _, _ = BAD[kind]
        insert_raw(db_url, f"bad-{kind}", body, attempts, priority, 1.0)  # due long ago: claimed first
    queue = DatabaseQueue.from_url(db_url)
    manager = QueueManager({"db": queue}, registry=JobRegistry().with_job(Behind), container=Container())
    manager.dispatch(Behind(7))
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1, prefetch=0)).run()
    assert ran == [7], "the due job behind the unreadable rows did not run"
    assert (stats.processed, stats.discarded) == (1, 2)
    assert queue.size() == 0 and queue.failed_count() == 2
    queue.close()
