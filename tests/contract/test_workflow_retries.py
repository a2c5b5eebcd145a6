"""Retrying a failed job of a batch or a link of a chain, on every lock store
against its real server: the memory store, and the SQLite, PostgreSQL, MariaDB
and Redis stores, each counted the careful way (a memory driver's worker counts
in the store, once per job id), and the database and Redis drivers with a store
of their own, whose workers count with the acknowledgements (PostgreSQL's
claim, SQLite's and MariaDB's settle, Redis's count_ack.lua), and PostgreSQL's
driver counting in a Redis store.

A retried failed job goes back to pending (failed -1, pending +1) and its new
outcome counts once; each of a batch's callbacks, and a chain's ``catch``, runs
at most once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.base import BaseQueue, CountsBatches

RIGS = {
    "memory": ("memory", "memory"),
    "memory-sqlite": ("memory", "sqlite"),
    "memory-postgres": ("memory", "postgres"),
    "memory-mysql": ("memory", "mysql"),
    "memory-redis": ("memory", "redis"),
    "sqlite": ("sqlite", "own"),
    "postgres": ("postgres", "own"),
    "mysql": ("mysql", "own"),
    "redis": ("redis", "own"),
    "postgres-redis": ("postgres", "redis"),
}
_MARKS = {"postgres": pytest.mark.postgres, "mysql": pytest.mark.mysql, "redis": pytest.mark.redis}


def _rig_params() -> list[Any]:
    params = []
    for name, (driver, store) in RIGS.items():
        marks = [_MARKS[kind] for kind in {driver, store} if kind in _MARKS]
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@dataclass
class Row(Job):
    NAME = "retries.row"
    TRIES = 1

    n: int = 0
    #: The rows that raise when they run.
    broken: ClassVar[set[int]] = set()

    def handle(self, context: JobContext) -> None:
        if self.n in Row.broken:
            raise RuntimeError(f"row {self.n} is broken")


@dataclass
class LaterRow(Row):
    """A row on a queue of its own, run after the others: its batch stays pending."""

    NAME = "retries.later-row"
    QUEUE = "later"


@dataclass
class Heard(Job):
    """A callback (or a chain's link): records that it ran."""

    NAME = "retries.heard"

    what: str = ""
    heard: ClassVar[list[str]] = []

    def handle(self, context: JobContext) -> None:
        Heard.heard.append(self.what)


@dataclass
class Link(Job):
    NAME = "retries.link"
    TRIES = 1

    n: int = 0

    def handle(self, context: JobContext) -> None:
        Heard.heard.append(f"link {self.n}")
        if self.n in Row.broken:
            raise RuntimeError(f"link {self.n} is broken")


@dataclass
class Rig:
    name: str
    driver: BaseQueue
    manager: QueueManager
    closing: list[Any] = field(default_factory=list)

    def run(self, *queues: str) -> None:
        """Run everything due on ``queues`` (the callbacks' too) and return.

        A ``once`` run on Redis may end while its loop's blocking read has just
        taken a job queued meanwhile (a chain's next link, a callback); the next
        run in this thread hands it out, so runs go on while anything is queued."""
        names = list(queues or ("default",))
        for _ in range(20):
            Worker(self.manager, options=WorkerOptions(once=True, concurrency=2, queues=names)).run()
            if not any(self.driver.size(name) for name in names):
                return
        raise AssertionError(f"jobs still queued on {names} after 20 runs: {[self.driver.size(n) for n in names]}")

    def failed_ids(self) -> list[str]:
        return sorted(failed.id for failed in self.driver.failed_jobs(limit=1000))

    def counts(self, batch_id: str) -> tuple[int, int, int, int]:
        batch = self.manager.find_batch(batch_id)
        assert batch is not None
        return batch.total, batch.pending, batch.processed, batch.failed


def _database_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    from rainier_sync.drivers.database import DatabaseQueue
    from tests.drivers.database.support import emptied, mysql_database_url, postgres_schema_url

    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / f'{uuid.uuid4().hex[:8]}.db'}"
        queue = DatabaseQueue.from_url(url)
        queue.migrate()
        queue.close()
        return url
    url = postgres_schema_url(request) if kind == "postgres" else mysql_database_url(request)
    return emptied(url, "rainier_jobs", "rainier_failed_jobs", "rainier_locks")


@pytest.fixture(params=_rig_params())
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    from rainier_sync.drivers import MemoryQueue
    from rainier_sync.locks import MemoryLockStore

    kind, store_kind = RIGS[request.param]
    closing: list[Any] = []
    prefix = f"rsretry:{uuid.uuid4().hex[:12]}:"
    redis_client: Any = None
    driver: BaseQueue
    if kind == "memory":
        driver = MemoryQueue(reservation=30)
    elif kind == "redis":
        from rainier_sync.drivers import RedisQueue

        driver = RedisQueue.from_url(request.getfixturevalue("redis_url"), prefix=prefix, reservation=30)
        redis_client = driver.client
    else:
        from rainier_sync.drivers.database import DatabaseQueue

        driver = DatabaseQueue.from_url(_database_url(request, kind, tmp_path), reservation=30)
    closing.append(driver)
    locks: Any
    if store_kind == "memory":
        locks = MemoryLockStore()
    elif store_kind == "own":
        if kind == "redis":
            from rainier_sync.locks import RedisLockStore

            locks = RedisLockStore.from_url(request.getfixturevalue("redis_url"), prefix=prefix + "lock:")
            closing.append(locks)
        else:
            locks = driver.lock_store()  # type: ignore[attr-defined]
            locks.migrate()
    elif store_kind == "redis":
        from rainier_sync.locks import RedisLockStore

        locks = RedisLockStore.from_url(request.getfixturevalue("redis_url"), prefix=prefix + "lock:")
        redis_client = redis_client or locks._client
        closing.append(locks)
    else:
        from rainier_sync.locks import DatabaseLockStore

        locks = DatabaseLockStore.from_url(_database_url(request, store_kind, tmp_path))
        locks.migrate()
        closing.append(locks)
    registry = JobRegistry().with_job(Row).with_job(LaterRow).with_job(Heard).with_job(Link)
    manager = QueueManager({"main": driver}, registry=registry, container=Container(), locks=locks)
    counts = driver.capabilities.counts_batches and CountsBatches.of(driver).counts_batches_of(locks)
    assert counts == (store_kind == "own"), "the counting way this rig is meant to test"
    Row.broken = set()
    Heard.heard.clear()
    try:
        yield Rig(request.param, driver, manager, closing)
    finally:
        if redis_client is not None:
            for key in list(redis_client.scan_iter(match=prefix + "*", count=1000)):
                redis_client.delete(key)
        for thing in reversed(closing):
            thing.close()


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The ids of the jobs each way of counting counted: ``claim`` (PostgreSQL's
    claim), ``settle`` (the database driver's transaction), ``count_ack`` (Redis's
    script) and ``store`` (the lock store's ``tally_settle_many``, the careful way)."""
    from rainier_sync.drivers.database import claims
    from rainier_sync.drivers.database import failed as database_failed
    from rainier_sync.drivers.redis.counting import _Counting
    from rainier_sync.locks import DatabaseLockStore, MemoryLockStore, RedisLockStore

    seen: dict[str, list[str]] = {"claim": [], "settle": [], "count_ack": [], "store": []}
    claim_counting, settle_counting = claims.claim_counting, database_failed.settle_counting
    count_call = _Counting._count_call

    def claim(core: Any, queue: str, limit: int, acks: Any, counts: Any, most: int) -> Any:
        rows, left = claim_counting(core, queue, limit, acks, counts, most)
        seen["claim"] += [item[0].id for item in counts if item[0].receipt[0] not in set(left)]
        return rows, left

    def settle(core: Any, settled: Any, move: Any, after: Any) -> None:
        seen["settle"] += [item[0].id for item, _ in settled]
        settle_counting(core, settled, move, after)

    def count(self: Any, store: Any, per_tally: Any, streams: Any, reply: Any) -> Any:
        seen["count_ack"] += [item[0].id for found in per_tally.values() for item, _, _ in found]
        return count_call(self, store, per_tally, streams, reply)

    monkeypatch.setattr(claims, "claim_counting", claim)
    monkeypatch.setattr(database_failed, "settle_counting", settle)
    monkeypatch.setattr(_Counting, "_count_call", count)
    for store in (MemoryLockStore, DatabaseLockStore, RedisLockStore):

        def many(self: Any, items: Any, _real: Any = store.tally_settle_many) -> Any:
            seen["store"] += [member for _, member, _, _ in items]
            return _real(self, items)

        monkeypatch.setattr(store, "tally_settle_many", many)
    return seen


def _way(rig: Rig, outcome: str) -> str:
    """How ``rig``'s worker counts a job of a batch that stays pending after it."""
    kind, store = RIGS[rig.name]
    if store != "own":
        return "store"
    if kind == "redis":
        return "count_ack" if outcome == "processed" else "store"  # a failure goes the careful way
    return "claim" if kind == "postgres" and outcome == "processed" else "settle"


def _within(rig: Rig) -> bool:
    """Whether ``rig``'s retry changes the counts in the driver's own transaction."""
    kind, store = RIGS[rig.name]
    return store == "own" and kind != "redis"


current: QueueManager | None = None


def current_manager() -> QueueManager:
    """Factory for ``--app tests.contract.test_workflow_retries:current_manager``."""
    assert current is not None
    return current


# -- batches ------------------------------------------------------------------------------------------------
def _batch(rig: Rig, rows: list[Job]) -> str:
    pending = rig.manager.batch(rows, name="retries").allow_failures()
    pending.then(Heard("then")).catch(Heard("catch")).finally_(Heard("finally"))
    return pending.dispatch().id


@pytest.mark.parametrize("again", ["succeeds", "fails"])
def test_a_retried_job_of_a_pending_batch_counts_its_new_outcome_once(
    rig: Rig, again: str, paths: dict[str, list[str]]
) -> None:
    """The retried job finishes while its batch is still pending: counted with its
    acknowledgement where the driver counts so (PostgreSQL's claim, count_ack.lua)."""
    batch_id = _batch(rig, [Row(0), Row(1), Row(2), LaterRow(3), LaterRow(4)])
    Row.broken = {1}
    rig.run("default")
    assert rig.counts(batch_id) == (5, 2, 2, 1)
    assert Heard.heard == ["catch"]
    (failed_id,) = rig.failed_ids()
    if again == "succeeds":
        Row.broken = set()
    assert rig.manager.retry_failed(failed_id)
    assert rig.counts(batch_id) == (5, 3, 2, 0), "back to pending: failed -1, pending +1"
    for seen in paths.values():
        seen.clear()
    rig.run("default")
    assert rig.counts(batch_id) == ((5, 2, 3, 0) if again == "succeeds" else (5, 2, 2, 1))
    way = _way(rig, "processed" if again == "succeeds" else "failed")
    assert failed_id in paths[way], f"counted by {way}: {paths}"
    rig.run("later", "default")  # the callbacks go to the default queue
    batch = rig.manager.find_batch(batch_id)
    assert batch is not None and batch.finished
    if again == "succeeds":
        assert rig.counts(batch_id) == (5, 0, 5, 0)
        assert sorted(Heard.heard) == ["catch", "finally", "then"], "then: every job has now succeeded"
        assert rig.failed_ids() == []
    else:
        assert rig.counts(batch_id) == (5, 0, 4, 1)
        assert sorted(Heard.heard) == ["catch", "finally"], "catch ran once"
        assert rig.failed_ids() == [failed_id]


@pytest.mark.parametrize("again", ["succeeds", "fails"])
def test_a_retried_job_of_a_finished_batch_counts_once_and_no_callback_runs_twice(rig: Rig, again: str) -> None:
    """The retried job finishes its batch again: counted the careful way (the
    count that finds nothing pending queues the callbacks)."""
    batch_id = _batch(rig, [Row(0), Row(1), Row(2)])
    Row.broken = {1}
    rig.run("default")
    assert rig.counts(batch_id) == (3, 0, 2, 1)
    assert sorted(Heard.heard) == ["catch", "finally"]
    (failed_id,) = rig.failed_ids()
    if again == "succeeds":
        Row.broken = set()
    assert rig.manager.retry_failed(failed_id)
    batch = rig.manager.find_batch(batch_id)
    assert batch is not None and not batch.finished and rig.counts(batch_id) == (3, 1, 2, 0)
    rig.run("default")
    if again == "succeeds":
        assert rig.counts(batch_id) == (3, 0, 3, 0)
        assert sorted(Heard.heard) == ["catch", "finally", "then"], "then once, finally not again"
    else:
        assert rig.counts(batch_id) == (3, 0, 2, 1)
        assert sorted(Heard.heard) == ["catch", "finally"], "neither catch nor finally again"
    # A second retry, and its run, count the same way again.
    if again == "fails":
        Row.broken = set()
        assert rig.manager.retry_failed(failed_id)
        rig.run("default")
        assert rig.counts(batch_id) == (3, 0, 3, 0)
        assert sorted(Heard.heard) == ["catch", "finally", "then"]
    assert not rig.manager.retry_failed(failed_id), "nothing left to retry"
    assert rig.counts(batch_id) == (3, 0, 3, 0)


def test_retry_all_of_two_batches_of_ten_counts_every_job_once(rig: Rig) -> None:
    """``rainier-sync queue:retry all`` of two 10-job batches whose every job failed."""
    from rainier_sync.cli import EXIT_OK, main

    global current
    first = _batch(rig, [Row(n) for n in range(10)])
    second = _batch(rig, [Row(n) for n in range(10, 20)])
    Row.broken = set(range(20))
    rig.run("default")
    assert rig.counts(first) == rig.counts(second) == (10, 0, 0, 10)
    assert sorted(Heard.heard) == ["catch", "catch", "finally", "finally"]
    assert len(rig.failed_ids()) == 20
    Row.broken = set(range(5, 15))  # each batch: five succeed, five fail again
    current = rig.manager
    try:
        assert main(["queue:retry", "all", "--app=tests.contract.test_workflow_retries:current_manager"]) == EXIT_OK
    finally:
        current = None
    assert rig.counts(first) == rig.counts(second) == (10, 10, 0, 0)
    rig.run("default")
    assert rig.counts(first) == rig.counts(second) == (10, 0, 5, 5)
    assert sorted(Heard.heard) == ["catch", "catch", "finally", "finally"], "no callback a second time"
    assert len(rig.failed_ids()) == 10


def test_a_retry_that_fails_leaves_the_counts_as_they_were(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's retry raises: the job is still failed, and counted so."""
    batch_id = _batch(rig, [Row(0), Row(1)])
    Row.broken = {1}
    rig.run("default")
    (failed_id,) = rig.failed_ids()
    before = rig.counts(batch_id)

    def broken(*args: object) -> bool:
        raise ConnectionError("the failed store went away")

    for name in ("retry_failed", "retry_failed_counting"):
        if hasattr(rig.driver, name):
            monkeypatch.setattr(rig.driver, name, broken)
    with pytest.raises(ConnectionError):
        rig.manager.retry_failed(failed_id)
    assert rig.counts(batch_id) == before == (2, 0, 1, 1)
    monkeypatch.undo()
    Row.broken = set()
    assert rig.manager.retry_failed(failed_id)
    rig.run("default")
    assert rig.counts(batch_id) == (2, 0, 2, 0)
    assert sorted(Heard.heard) == ["catch", "finally", "then"]


def test_two_retries_of_one_job_at_once_queue_it_once_and_count_it_once(rig: Rig) -> None:
    """A second retry of the job comes between the first's two steps (after the
    store forgot its count, before the driver queued it)."""
    batch_id = _batch(rig, [Row(0), Row(1)])
    Row.broken = {1}
    rig.run("default")
    (failed_id,) = rig.failed_ids()
    Row.broken = set()
    name = "retry_failed_counting" if _within(rig) else "retry_failed"
    real = getattr(rig.driver, name)
    answers: list[bool] = []
    calls: list[int] = []

    def first(*args: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            answers.append(rig.manager.retry_failed(failed_id))  # the other retry, all of it
        answers.append(bool(real(*args)))
        return answers[-1]

    setattr(rig.driver, name, first)
    try:
        assert not rig.manager.retry_failed(failed_id), "the other retry queued it"
    finally:
        delattr(rig.driver, name)
    assert answers == [True, True, False], "the other retry's driver call, the other retry, this one's driver call"
    assert rig.counts(batch_id) == (2, 1, 1, 0)
    rig.run("default")
    assert rig.counts(batch_id) == (2, 0, 2, 0)
    assert sorted(Heard.heard) == ["catch", "finally", "then"]


def test_a_retry_cut_short_between_its_steps_is_made_good_by_the_next(rig: Rig) -> None:
    """The retrying process died after the store forgot the job's count, before
    the driver queued it: the next retry queues it, and it counts once."""
    if _within(rig):
        pytest.skip("the database driver's retry is one transaction: nothing comes between its steps")
    batch_id = _batch(rig, [Row(0), Row(1)])
    Row.broken = {1}
    rig.run("default")
    (failed_id,) = rig.failed_ids()
    locks = rig.manager.locks
    assert locks is not None
    assert locks.tally_unsettle(f"batch:{batch_id}", failed_id, "failed", 3600)[1]
    assert rig.counts(batch_id) == (2, 1, 1, 0) and rig.failed_ids() == [failed_id]
    Row.broken = set()
    assert rig.manager.retry_failed(failed_id)
    assert rig.counts(batch_id) == (2, 1, 1, 0), "not forgotten twice"
    rig.run("default")
    assert rig.counts(batch_id) == (2, 0, 2, 0)


def test_a_retried_job_of_a_cancelled_batch_is_skipped_and_counts_as_skipped(rig: Rig) -> None:
    pending = rig.manager.batch([Row(1)]).then(Heard("then")).catch(Heard("catch")).finally_(Heard("finally"))
    batch_id = pending.dispatch().id
    Row.broken = {1}
    rig.run("default")
    batch = rig.manager.find_batch(batch_id)
    assert batch is not None and batch.cancelled and (batch.failed, batch.skipped, batch.pending) == (1, 0, 0)
    (failed_id,) = rig.failed_ids()
    Row.broken = set()
    assert rig.manager.retry_failed(failed_id)
    rig.run("default")
    batch = rig.manager.find_batch(batch_id)
    assert batch is not None and (batch.processed, batch.failed, batch.skipped, batch.pending) == (0, 0, 1, 0)
    assert sorted(Heard.heard) == ["catch", "finally"]
    assert rig.failed_ids() == []


# -- chains -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("again", ["succeeds", "fails"])
def test_a_retried_link_resumes_its_chain_and_catch_runs_once(rig: Rig, again: str) -> None:
    rig.manager.chain([Link(1), Link(2), Link(3)]).catch(Heard("catch")).dispatch()
    Row.broken = {2}
    rig.run("default")
    assert Heard.heard == ["link 1", "link 2", "catch"]
    (failed_id,) = rig.failed_ids()
    if again == "succeeds":
        Row.broken = set()
    assert rig.manager.retry_failed(failed_id)
    rig.run("default")
    if again == "succeeds":
        assert Heard.heard == ["link 1", "link 2", "catch", "link 2", "link 3"], "the chain goes on"
        assert rig.failed_ids() == []
    else:
        assert Heard.heard == ["link 1", "link 2", "catch", "link 2"], "catch runs once per chain"
        assert rig.failed_ids() == [failed_id]
