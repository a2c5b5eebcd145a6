"""Listing on every dialect where the contract suite does not reach: rows nobody
can read are shown, not raised, and the name filter's own escape character."""

from __future__ import annotations

import sqlite3
import urllib.parse
from contextlib import closing
from typing import Any

import pytest

from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.types import QueuedJob

from .test_unreadable import BAD, NOT_STORABLE_ON_SERVERS, good_jobs, insert_raw


def test_a_page_shows_the_rows_nobody_can_read_as_far_as_they_can_be_read(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    try:
        queue.push_many(good_jobs())
        kinds = [k for k in sorted(BAD) if queue.dialect == "sqlite" or k not in NOT_STORABLE_ON_SERVERS]
        for kind in kinds:
            body, attempts, priority, available_at, _ = BAD[kind]
            insert_raw(db_url, f"bad-{kind}", body, attempts, priority, available_at)

        listed = {
            entry.job.id: entry
            for state in ("ready", "delayed")
            for entry in queue.list_jobs("default", state, limit=100)  # type: ignore[arg-type]
        }

        assert set(listed) == {job.id for job in good_jobs()} | {f"bad-{kind}" for kind in kinds}
        for job in good_jobs():
            assert listed[job.id].job.payload == job.payload and not listed[job.id].job.meta
        for kind in kinds:
            entry = listed[f"bad-{kind}"]
            reason: Any = (entry.job.meta or {}).get("unreadable")
            assert reason and BAD[kind][4] in reason, (kind, reason)
            assert entry.job.name == "dbtest.x" and entry.job.payload == {}
            assert entry.job.receipt is None
        if "available-at-soon" in kinds:  # SQLite: a due time held as text is never due
            assert listed["bad-available-at-soon"].state == "delayed"
            assert listed["bad-available-at-soon"].job.available_at == 0.0
        found = queue.find_job("bad-not-json")
        assert found is not None and found.job.meta is not None and found.job.meta["raw"] == "{not json"

        queue.reserve_many(["default"], 100)  # the claim moves every unreadable row aside
        assert queue.list_jobs("default", "ready") == []
        assert {e.job.id for e in queue.list_jobs("default", "reserved", limit=100)} == {j.id for j in good_jobs()}
    finally:
        queue.close()


def test_the_name_filter_takes_its_own_escape_character_and_quotes_literally(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    try:
        names = ["a!b", "a!!b", "a%b", "it's", 'say "hi"', "a\\b", "ab"]
        queue.push_many([QueuedJob(id=f"j{n}", name=name, queue="default", payload={}) for n, name in enumerate(names)])

        def named(text: str) -> list[str]:
            return sorted(e.job.name for e in queue.list_jobs("default", "ready", name=text, limit=100))

        assert named("!") == ["a!!b", "a!b"]
        assert named("!!") == ["a!!b"]
        assert named("!%") == []
        assert named("'") == ["it's"]
        assert named('"hi"') == ['say "hi"']
        assert named("\\") == ["a\\b"]
        assert named("a%b") == ["a%b"]
    finally:
        queue.close()


def test_find_job_tells_an_id_from_one_of_another_case(db_url: str) -> None:
    # MariaDB's default collation ignores case: the row read must be the id asked for.
    queue = DatabaseQueue.from_url(db_url)
    try:
        queue.push(QueuedJob(id="Job-ABC", name="dbtest.x", queue="default", payload={}))
        assert queue.find_job("job-abc") is None
        found = queue.find_job("Job-ABC")
        assert found is not None and found.state == "ready"
    finally:
        queue.close()


@pytest.mark.parametrize("filtered", [False, True], ids=["all", "by-name"])
@pytest.mark.parametrize("state", ["ready", "delayed", "reserved"])
def test_each_state_reads_the_claim_indexes_on_sqlite(sqlite_url: str, state: str, filtered: bool) -> None:
    """The plan, not the speed: a page of ready jobs walks the claim's partial
    index in its order (no sort), reserved ones the reservations' index."""
    queue = DatabaseQueue.from_url(sqlite_url)
    try:
        sql = queue._sql(queue._page_sql(state, filtered))  # type: ignore[arg-type]
    finally:
        queue.close()
    params = ["default", *([1.0] if state != "reserved" else []), *(["%x%"] if filtered else []), 50, 0]
    path = urllib.parse.urlsplit(sqlite_url).path[1:]
    with closing(sqlite3.connect(path)) as conn:
        plan = " | ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
    index = "rainier_jobs_reserved" if state == "reserved" else "rainier_jobs_ready"
    assert index in plan, plan
    if state == "ready":
        assert "TEMP B-TREE" not in plan, f"the page is sorted, not walked in index order: {plan}"
