"""Counting the jobs of batches with their acknowledgements (lua/count_ack.lua), on a real Redis."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import redis

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.batch import batch_key
from rainier_sync.drivers import RedisQueue
from rainier_sync.locks import MemoryLockStore, RedisLockStore
from rainier_sync.types import QueuedJob

pytestmark = pytest.mark.redis

QUEUE = "counted"


@dataclass
class Row(Job):
    NAME = "redis.counting.row"
    QUEUE = QUEUE
    TRIES = 1

    n: int = 0
    cancel: bool = False
    ran: ClassVar[list[int]] = []
    heard: ClassVar[list[str]] = []
    manager: ClassVar[Any] = None
    done: ClassVar[threading.Event] = threading.Event()

    def handle(self, context: JobContext) -> None:
        if self.n < 0:
            Row.heard.append(f"callback {-self.n}")
            if self.n == -3:
                Row.done.set()
            return
        Row.ran.append(self.n)
        if self.cancel:
            batch = context.batch
            assert batch is not None
            assert Row.manager.cancel_batch(batch.id)


class Watched(RedisLockStore):
    """A real store that keeps what its careful way (``tally_settle_many``) counted."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix=prefix)
        self.settled: list[str] = []

    def tally_settle_many(self, items: Sequence[tuple[str, str, str, float]]) -> list[tuple[dict[str, int], bool]]:
        self.settled += [member for _, member, _, _ in items]
        return self.tallied(items)

    def tallied(self, items: Sequence[tuple[str, str, str, float]]) -> list[tuple[dict[str, int], bool]]:
        """Count without being watched."""
        return RedisLockStore.tally_settle_many(self, items)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    Row.ran.clear()
    Row.heard.clear()
    Row.done.clear()
    yield
    Row.manager = None


@pytest.fixture
def queue(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    made = RedisQueue.from_url(redis_url, prefix=prefix, reservation=30)
    yield made
    made.close()


@pytest.fixture
def locks(redis_client: redis.Redis, prefix: str) -> Watched:
    return Watched(redis_client, prefix + "lock:")


def _manager(queue: RedisQueue, locks: RedisLockStore) -> QueueManager:
    manager = QueueManager({"r": queue}, registry=JobRegistry().with_job(Row), container=Container(), locks=locks)
    Row.manager = manager
    return manager


def _drain(manager: QueueManager, concurrency: int = 4) -> None:
    """Run a worker until the queue is empty (``once``), at most a minute."""
    worker = Worker(manager, options=WorkerOptions(queues=[QUEUE], concurrency=concurrency, once=True))
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the worker did not drain the queue within a minute"


def _reserve(queue: RedisQueue, n: int) -> list[QueuedJob]:
    taken: list[QueuedJob] = []
    for _ in range(10):
        taken += queue.reserve_many([QUEUE], n - len(taken))
        if len(taken) >= n:
            break
    assert len(taken) == n
    return taken


def _items(jobs: Sequence[QueuedJob], batch_id: str) -> list[tuple[QueuedJob, str, str, float]]:
    return [(job, batch_key(batch_id), "processed", 3600.0) for job in jobs]


# -- which stores are counted with the acknowledgements ---------------------------------------------------
def test_a_lock_store_on_the_same_server_and_database_is_counted_with_the_acknowledgements(
    queue: RedisQueue, locks: Watched, redis_url: str, prefix: str
) -> None:
    assert queue.counts_batches_of(locks)
    assert queue.open_session().counts_batches_of(locks)
    from_url = RedisLockStore.from_url(redis_url, prefix=prefix + "other:")
    again = RedisQueue.from_url(redis_url, prefix=prefix, reservation=30)
    try:
        assert again.counts_batches_of(from_url)
        # One driver counts in one store's keys: a second store of other keys (another
        # manager on the same driver) has its batches counted in that store, its own way.
        assert not queue.counts_batches_of(from_url)
        assert queue.counts_batches_of(locks)
    finally:
        again.close()
        from_url.close()


def test_a_lock_store_on_another_database_or_of_another_kind_is_not(
    queue: RedisQueue, redis_client: redis.Redis, prefix: str
) -> None:
    kwargs = redis_client.connection_pool.connection_kwargs
    other_db = redis.Redis(host=kwargs.get("host"), port=kwargs.get("port"), db=(int(kwargs.get("db", 0)) + 1) % 16)
    try:
        assert not queue.counts_batches_of(RedisLockStore(other_db, prefix=prefix))
    finally:
        other_db.close()
    assert not queue.counts_batches_of(MemoryLockStore())


def test_on_a_cluster_batches_are_counted_in_the_store(redis_cluster_url: str) -> None:
    cluster = RedisQueue.from_url(redis_cluster_url, prefix="rscount:")
    store = RedisLockStore.from_url(redis_cluster_url, prefix="rscount:lock:")
    try:
        assert not cluster.counts_batches_of(store)
    finally:
        store.close()
        cluster.close()


# -- the driver's calls ----------------------------------------------------------------------------------
def test_jobs_are_counted_and_acknowledged_together_and_a_finishing_round_is_held(
    queue: RedisQueue, locks: Watched
) -> None:
    manager = _manager(queue, locks)
    batch = manager.batch([Row(n) for n in range(3)]).dispatch()
    first, second, third = _reserve(queue, 3)
    assert queue.counts_batches_of(locks)

    taken, held = queue.acknowledge_counting([first], _items([first], batch.id), [], 0)
    assert (taken, held) == ([], [])
    counts = locks.tally(batch_key(batch.id))
    assert counts is not None and (counts["processed"], counts["pending"]) == (1, 2)
    assert queue.size(QUEUE) == 2, "counted and acknowledged"

    # the two left would finish the batch: neither counted nor acknowledged, for the careful way
    taken, held = queue.acknowledge_counting([second, third], _items([second, third], batch.id), [], 0)
    assert taken == [] and {job.id for job in held} == {second.id, third.id}
    counts = locks.tally(batch_key(batch.id))
    assert counts is not None and (counts["processed"], counts["pending"]) == (1, 2)
    assert queue.size(QUEUE) == 2

    # a failure's count queues its batch's catch: held, and not acknowledged, beside one counted
    mixed = [(second, batch_key(batch.id), "failed", 3600.0), (third, batch_key(batch.id), "processed", 3600.0)]
    assert queue.acknowledge_counting([second, third], mixed, [], 0) == ([], [second])
    counts = locks.tally(batch_key(batch.id))
    assert counts is not None and (counts["processed"], counts["failed"], counts["pending"]) == (2, 0, 1)
    assert queue.size(QUEUE) == 1
    assert locks.settled == []


@pytest.mark.parametrize("counted_by", ["count_ack", "store"])
def test_a_job_counted_and_then_delivered_again_counts_once(queue: RedisQueue, locks: Watched, counted_by: str) -> None:
    manager = _manager(queue, locks)
    batch = manager.batch([Row(n) for n in range(4)]).then(Row(-1)).finally_(Row(-3)).dispatch()
    taken = _reserve(queue, 4)
    # Counted, not acknowledged: what a script cut short between its count and its
    # acknowledgement leaves; then its reservation lapses (given back) and it runs again.
    counted = taken[0]
    if counted_by == "count_ack":  # the script counts it, and its acknowledgement misses (no such entry)
        reply: list[Any] = []
        item = _items([counted], batch.id)[0]
        receipt = counted.receipt
        streams = {(receipt.queue, receipt.band): (1, [], [])}
        queue._send_deferred([queue._count_call(locks, {item[1]: [(item, 1, b"1-1")]}, streams, reply)])
        queue._sync()
        assert reply == [[]]
    else:
        locks.tallied([(batch_key(batch.id), counted.id, "processed", 3600.0)])
    counts = locks.tally(batch_key(batch.id))
    assert counts is not None and (counts["processed"], counts["pending"]) == (1, 3)
    queue.give_back(taken)

    _drain(manager)

    assert Row.done.wait(10)
    done = manager.find_batch(batch.id)
    assert done is not None
    assert (done.total, done.processed, done.pending, done.finished) == (4, 4, 0, True)
    assert sorted(Row.ran) == [0, 1, 2, 3]
    assert sorted(Row.heard) == ["callback 1", "callback 3"]


# -- a worker draining batches ---------------------------------------------------------------------------
def test_a_batch_drained_by_a_worker_counts_exactly_and_calls_back_once(queue: RedisQueue, locks: Watched) -> None:
    manager = _manager(queue, locks)
    batch = manager.batch([Row(n) for n in range(300)]).then(Row(-1)).catch(Row(-2)).finally_(Row(-3)).dispatch()

    _drain(manager)

    assert Row.done.wait(10)
    done = manager.find_batch(batch.id)
    assert done is not None
    assert (done.total, done.processed, done.failed, done.skipped, done.pending) == (300, 300, 0, 0, 0)
    assert sorted(Row.ran) == list(range(300))
    assert sorted(Row.heard) == ["callback 1", "callback 3"]
    assert len(locks.settled) < 300, "most rounds counted with their acknowledgements, not in the store"
    assert queue.size(QUEUE) == 0


def test_a_batch_cancelled_mid_drain_skips_the_rest_and_finishes_once(queue: RedisQueue, locks: Watched) -> None:
    manager = _manager(queue, locks)
    jobs = [Row(n, cancel=n == 20) for n in range(200)]
    batch = manager.batch(jobs).allow_failures().then(Row(-1)).finally_(Row(-3)).dispatch()

    _drain(manager, concurrency=1)

    assert Row.done.wait(10)
    done = manager.find_batch(batch.id)
    assert done is not None and done.cancelled and done.finished
    assert 20 in Row.ran
    assert done.processed == len(Row.ran) and done.skipped == 200 - len(Row.ran) > 0
    assert Row.heard == ["callback 3"], "finally once; then needs every job to succeed"
    assert queue.size(QUEUE) == 0


def test_under_sentinel_only_the_same_service_sentinels_and_database_count_with_the_acknowledgements(
    redis_sentinel_url: str,
) -> None:
    base = redis_sentinel_url.rsplit("/", 1)[0]
    queue = RedisQueue.from_url(base + "/3", prefix="rscount:")
    same = RedisLockStore.from_url(base + "/3", prefix="rscount:lock:")
    other_db = RedisLockStore.from_url(base + "/4", prefix="rscount:lock:")
    try:
        assert queue.counts_batches_of(same)
        assert not queue.counts_batches_of(other_db)
    finally:
        for closing in (other_db, same, queue):
            closing.close()
