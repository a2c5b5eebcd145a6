"""Listing on every dialect where the contract suite does not reach: rows nobody
can read are shown, not raised, and the name filter's own escape character."""

from __future__ import annotations

import sqlite3
import urllib.parse
from contextlib import closing
from typing import Any

import pytest

from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.drivers.paging import Page
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


@pytest.mark.parametrize("needle", [None, "%x%"], ids=["all", "by-name"])
@pytest.mark.parametrize("state", ["ready", "reserved"])
def test_a_page_is_chosen_on_the_claim_indexes_on_sqlite(sqlite_url: str, state: str, needle: str | None) -> None:
    """The plan, not the speed: a page of ready jobs (and the edge of a name
    filter's bound) is walked on the claim's partial index in its order, without
    a sort; reserved ones on the reservations' index."""
    queue = DatabaseQueue.from_url(sqlite_url)
    now = [1.0] if state == "ready" else []
    edge = [1.0] * (3 if state == "ready" else 2) if needle else []
    try:
        page = queue._chosen(state, "default", now, None, 50, 0, needle, edge)  # type: ignore[arg-type]
        bound = queue._chosen(state, "default", now, None, 1, 10_000)  # type: ignore[arg-type]
    finally:
        queue.close()
    path = urllib.parse.urlsplit(sqlite_url).path[1:]
    index = "rainier_jobs_reserved" if state == "reserved" else "rainier_jobs_ready"
    with closing(sqlite3.connect(path)) as conn:
        for sql, params in (page, bound):
            plan = [str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql.replace("%s", "?"), params)]
            assert index in plan[0], plan
            if state == "ready":
                assert len(plan) == 1, f"sorted, not walked in the index's order: {plan}"


def test_delayed_jobs_of_several_priorities_page_in_due_order(db_url: str) -> None:
    """One ordered walk per priority, merged: the order a sort of them all would give."""
    queue = DatabaseQueue.from_url(db_url)
    try:
        jobs = [
            QueuedJob(
                id=f"d{n}",
                name=f"dbtest.{n % 3}",
                queue="default",
                payload={},
                priority=n % 4 - 1,
                available_at=9e9 + (n * 7919) % 101,
            )
            for n in range(60)
        ]
        queue.push_many([*jobs, QueuedJob(id="now", name="dbtest.0", queue="default", payload={}, priority=7)])
        expected = [j.id for j in sorted(jobs, key=lambda j: (j.available_at, int(j.id[1:])))]
        assert queue._priorities("default") == [-1, 0, 1, 2, 7]
        whole = [e.job.id for e in queue.list_jobs("default", "delayed", limit=100)]
        assert whole == expected
        paged = [
            e.job.id for start in range(0, 60, 7) for e in queue.list_jobs("default", "delayed", offset=start, limit=7)
        ]
        assert paged == expected
        named = [e.job.id for e in queue.list_jobs("default", "delayed", name="test.1", offset=2, limit=5)]
        assert named == [i for i in expected if int(i[1:]) % 3 == 1][2:7]
        queue.listing_scan = 30
        bounded = queue.list_jobs("default", "delayed", name="test.1", limit=100)
        assert [e.job.id for e in bounded] == [i for i in expected[:30] if int(i[1:]) % 3 == 1]
        assert isinstance(bounded, Page) and not bounded.complete
    finally:
        queue.close()


def test_a_name_filter_looks_at_a_bounded_number_of_jobs_and_says_so(db_url: str) -> None:
    queue = DatabaseQueue.from_url(db_url)
    try:
        queue.listing_scan = 10
        queue.push_many([QueuedJob(id=f"o{n}", name="other.kind", queue="default", payload={}) for n in range(12)])
        queue.push(QueuedJob(id="w", name="wanted.kind", queue="default", payload={}))

        page = queue.list_jobs("default", "ready", name="wanted")
        assert isinstance(page, Page) and page == [] and not page.complete and page.bound == 10
        page = queue.list_jobs("default", "ready", name="OTHER", offset=8)
        assert [e.job.id for e in page] == ["o8", "o9"] and not page.complete, "matches past the bound are not seen"
        page = queue.list_jobs("default", "ready", name="other", limit=3)
        assert len(page) == 3 and page.complete, "a full page is complete"

        queue.listing_scan = 13
        page = queue.list_jobs("default", "ready", name="wanted")
        assert [e.job.id for e in page] == ["w"] and page.complete
        unfiltered = queue.list_jobs("default", "ready", limit=100)
        assert isinstance(unfiltered, Page) and len(unfiltered) == 13 and unfiltered.bound is None
    finally:
        queue.close()
