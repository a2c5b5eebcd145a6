"""Batches on the database driver with its own lock store: a worker counts a job
of a batch in the transaction that removes its row (no member rows), on SQLite,
PostgreSQL and MariaDB, against the real servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.drivers.database.counting import claim_counting
from rainier_sync.types import QueuedJob


@dataclass
class Row(Job):
    NAME = "dbtest.batch.row"
    TRIES = 1

    n: int = 0
    fail: bool = False

    def handle(self, context: JobContext) -> None:
        if self.fail:
            raise RuntimeError(f"row {self.n} is bad")


@dataclass
class Callback(Job):
    NAME = "dbtest.batch.callback"

    which: str = ""
    heard: ClassVar[list[str]] = []

    def handle(self, context: JobContext) -> None:
        Callback.heard.append(self.which)


def setup(url: str) -> tuple[DatabaseQueue, QueueManager]:
    queue = DatabaseQueue.from_url(url, reservation=30)
    locks = queue.lock_store()
    locks.migrate()
    registry = JobRegistry().with_job(Row).with_job(Callback)
    return queue, QueueManager({"db": queue}, registry=registry, container=Container(), locks=locks)


def members(queue: DatabaseQueue, batch_id: str) -> int:
    sql = "SELECT count(*) FROM rainier_tally_members WHERE tally_key = %s"
    rows = queue._backend.query(sql, (f"batch:{batch_id}",))
    return int(rows[0][0])


@pytest.mark.parametrize("fails", [False, True], ids=["succeeds", "fails"])
def test_a_worker_counts_jobs_of_batches_with_their_acknowledgements(db_url: str, fails: bool) -> None:
    Callback.heard.clear()
    queue, manager = setup(db_url)
    try:
        rows = [Row(n, fail=fails and n == 7) for n in range(60)]
        pending = manager.batch(rows).then(Callback("then")).catch(Callback("catch")).finally_(Callback("finally"))
        batch = (pending.allow_failures() if fails else pending).dispatch()
        assert queue.counts_batches_of(manager.locks)
        Worker(manager, options=WorkerOptions(once=True, concurrency=4)).run()
        done = manager.find_batch(batch.id)
        assert done is not None and done.finished and done.pending == 0
        assert (done.processed, done.failed) == ((59, 1) if fails else (60, 0))
        assert sorted(Callback.heard) == (["catch", "finally"] if fails else ["finally", "then"])
        assert members(queue, batch.id) == 0, "counted by the row's removal, not by a member row"
        assert queue.size() == 0
    finally:
        queue.close()


def test_a_cancelled_batch_counts_its_skipped_jobs_with_their_acknowledgements(db_url: str) -> None:
    Callback.heard.clear()
    queue, manager = setup(db_url)
    try:
        batch = manager.batch([Row(n) for n in range(20)]).finally_(Callback("finally")).dispatch()
        assert manager.cancel_batch(batch.id)
        stats = Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()
        done = manager.find_batch(batch.id)
        assert done is not None and (done.skipped, done.pending, done.cancelled) == (20, 0, True)
        assert stats.skipped == 20 and Callback.heard == ["finally"]
        assert members(queue, batch.id) == 0
    finally:
        queue.close()


def test_a_round_that_could_finish_its_batch_is_left_for_the_careful_way(pg_url: str) -> None:
    """PostgreSQL's claim counts a round only where its batch stays pending after
    it: the round that could finish a batch is left held, so its callbacks are
    queued before it is acknowledged."""
    queue, manager = setup(pg_url)
    try:
        far = manager.batch([Row(n) for n in range(10)]).dispatch()
        near = manager.batch([Row(n) for n in range(2)]).dispatch()
        held = queue.reserve_many(["default"], 12)
        assert len(held) == 12
        by_batch = {job.id: str((job.meta or {})["batch"]) for job in held}
        round_ = [job for job in held if by_batch[job.id] == far.id][:3] + [
            job for job in held if by_batch[job.id] == near.id
        ]
        counts = [(job, f"batch:{by_batch[job.id]}", "processed", 3600.0) for job in round_]
        claimed, left = claim_counting(queue, "default", 0, round_, counts, 1_000_000)
        assert claimed == []
        assert sorted(left) == sorted(job.receipt[0] for job in round_ if by_batch[job.id] == near.id)
        found_far, found_near = manager.find_batch(far.id), manager.find_batch(near.id)
        assert found_far is not None and (found_far.processed, found_far.pending) == (3, 7)
        assert found_near is not None and (found_near.processed, found_near.pending) == (0, 2), "left uncounted"
        assert queue.size() == 12 - 3, "the far batch's three acknowledged, the near one's two still held"
    finally:
        queue.close()


def test_a_round_counts_each_batch_by_the_rows_it_removed_and_keeps_every_count_alive(pg_url: str) -> None:
    """Two batches in one PostgreSQL claim: each counts only the rows the round
    removed (a row whose reservation another claim took since counts nothing), and
    every row of each tally is kept for the batch's retention from now."""
    queue, manager = setup(pg_url)
    try:
        first = manager.batch([Row(n) for n in range(10)]).dispatch()
        second = manager.batch([Row(n) for n in range(10)]).dispatch()
        held = queue.reserve_many(["default"], 20)
        of = {batch.id: [job for job in held if (job.meta or {})["batch"] == batch.id] for batch in (first, second)}
        round_ = of[first.id][:4] + of[second.id][:4]
        lost = round_[1]
        queue._backend.execute("UPDATE rainier_jobs SET token = 'someone else' WHERE seq = %s", (lost.receipt[0],))
        counts = [(job, f"batch:{(job.meta or {})['batch']}", "processed", 3600.0) for job in round_]
        claim_counting(queue, "default", 0, round_, counts, 1_000_000)
        expected: dict[str, int] = {}
        for job in round_:
            if job.id != lost.id:
                batch_id = str((job.meta or {})["batch"])
                expected[batch_id] = expected.get(batch_id, 0) + 1
        for batch in (first, second):
            found = manager.find_batch(batch.id)
            assert found is not None
            assert (found.processed, found.pending) == (expected[batch.id], 10 - expected[batch.id])
            rows = queue._backend.query(
                "SELECT field, expires_at FROM rainier_tallies WHERE tally_key = %s", (f"batch:{batch.id}",)
            )
            assert len(rows) >= 5 and len({round(float(until)) for _, until in rows}) == 1, rows
    finally:
        queue.close()


def test_a_round_of_one_batch_counts_the_rows_it_removed_and_leaves_a_finishing_round_held(pg_url: str) -> None:
    """The usual PostgreSQL round, every job one batch's: counted by the rows the
    delete removed (not one for a row another claim took), and a round that could
    finish its batch left held and uncounted; a round with a job of no batch
    among them counts the same way."""
    queue, manager = setup(pg_url)
    try:
        batch = manager.batch([Row(n) for n in range(10)]).dispatch()
        manager.dispatch(Row(99))
        held = queue.reserve_many(["default"], 11)
        of_batch = [job for job in held if (job.meta or {}).get("batch") == batch.id]
        plain = [job for job in held if not (job.meta or {}).get("batch")]
        assert len(of_batch) == 10 and len(plain) == 1
        key = f"batch:{batch.id}"

        def count(round_: list[QueuedJob], acks: list[QueuedJob]) -> list[int]:
            counts = [(job, key, "processed", 3600.0) for job in round_]
            return claim_counting(queue, "default", 0, acks, counts, 1_000_000)[1]

        lost = of_batch[1]
        queue._backend.execute("UPDATE rainier_jobs SET token = 'someone else' WHERE seq = %s", (lost.receipt[0],))
        assert count(of_batch[:4], of_batch[:4]) == []
        found = manager.find_batch(batch.id)
        assert found is not None and (found.processed, found.pending) == (3, 7)
        assert count(of_batch[4:6], of_batch[4:6] + plain) == [], "a job of no batch acknowledged along"
        found = manager.find_batch(batch.id)
        assert found is not None and (found.processed, found.pending) == (5, 5)
        rest = of_batch[6:] + [lost]
        assert queue._backend.execute(
            "UPDATE rainier_jobs SET token = %s WHERE seq = %s", (lost.receipt[1], lost.receipt[0])
        ) == 1
        assert sorted(count(rest, rest)) == sorted(job.receipt[0] for job in rest), "could finish it: left held"
        found = manager.find_batch(batch.id)
        assert found is not None and (found.processed, found.pending) == (5, 5)
        assert queue.size() == 5
    finally:
        queue.close()
