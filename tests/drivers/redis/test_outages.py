"""The Redis driver through outages a test owns: a TCP proxy in front of the real
server that breaks (the server is down), freezes (it hangs) or goes deaf (replies
are lost), then heals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from rainier_sync import Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, _clock, signals
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.redis import RedisUnavailableError
from rainier_sync.errors import QueueUnavailableError
from rainier_sync.locks import RedisLockStore
from tests.support import wait_until

from . import jobs
from .proxy import Proxy
from .test_driver import job

pytestmark = pytest.mark.redis

#: Slack for a busy two-core machine on top of a bound the settings promise.
SLACK = 5.0

_GATES: dict[str, threading.Event] = {}


@dataclass
class Gated(Job):
    """Counts its runs, then holds its thread until the test opens the gate."""

    NAME = "redis-tests.gated"
    TRIES = 3

    prefix: str
    n: int

    def handle(self, context: JobContext) -> None:
        context.resolve(redis.Redis).hincrby(self.prefix + "ran", str(self.n), 1)
        _GATES[self.prefix].wait(30)


def ran(client: redis.Redis, prefix: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.hgetall(prefix + "ran").items()}


@pytest.fixture
def reported() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def on_failed(sender: object, **kwargs: Any) -> None:
        got.append(kwargs)

    signals.queue_operation_failed.connect(on_failed)
    yield got
    signals.queue_operation_failed.disconnect(on_failed)


@pytest.fixture
def make(prefix: str) -> Iterator[Callable[..., RedisQueue]]:
    made: list[RedisQueue] = []

    def build(url: str, **options: Any) -> RedisQueue:
        queue = RedisQueue.from_url(url, prefix=prefix, **options)
        made.append(queue)
        return queue

    yield build
    for queue in made:
        queue.close()


def heal_after(proxy: Proxy, seconds: float) -> tuple[threading.Thread, list[float]]:
    """Heal the proxy ``seconds`` from now; the list gets the time (``_clock.now()``) just before it healed."""
    healed_at: list[float] = []
    cancel = threading.Event()

    def heal() -> None:
        cancel.wait(seconds)
        healed_at.append(_clock.now())
        proxy.heal()

    thread = threading.Thread(target=heal)
    thread.start()
    return thread, healed_at


# -- deadlines taken when a command is sent, also after a reconnect --------------------------

RIDE_OUT = {"reconnect": True, "reconnect_attempts": 60, "reconnect_max_backoff_ms": 100}


def _reserved_deadlines(client: redis.Redis, prefix: str) -> list[float]:
    return [score for _, score in client.zrange(prefix + "default:reserved", 0, -1, withscores=True)]


def test_a_reserve_that_waited_for_a_reconnect_records_its_deadline_from_when_it_ran(
    proxy: Proxy, make: Callable[..., RedisQueue], redis_client: redis.Redis, prefix: str
) -> None:
    queue = make(proxy.url, reservation=1, **RIDE_OUT)
    queue.push(job())
    assert queue.reserve_many(["other"], 1) == []  # the worker's connection is open
    proxy.break_()
    healer, healed_at = heal_after(proxy, 1.5)  # longer than the reservation
    got = queue.reserve_many(["default"], 1)
    healer.join()
    assert len(got) == 1
    (deadline,) = _reserved_deadlines(redis_client, prefix)
    assert deadline >= healed_at[0] + queue.reservation, "the reservation was born lapsed"


def test_a_renewal_that_waited_for_a_reconnect_counts_from_when_it_ran(
    proxy: Proxy, make: Callable[..., RedisQueue], redis_client: redis.Redis, prefix: str
) -> None:
    queue = make(proxy.url, reservation=1, **RIDE_OUT)
    queue.push(job())
    got = queue.reserve_many(["default"], 1)
    proxy.break_()
    healer, healed_at = heal_after(proxy, 1.5)
    queue.extend(got)
    healer.join()
    (deadline,) = _reserved_deadlines(redis_client, prefix)
    assert deadline >= healed_at[0] + queue.reservation


def test_a_release_that_waited_for_a_reconnect_is_due_its_delay_after_it_ran(
    proxy: Proxy, make: Callable[..., RedisQueue], redis_client: redis.Redis, prefix: str
) -> None:
    queue = make(proxy.url, reservation=30, **RIDE_OUT)
    queue.push(job())
    (got,) = queue.reserve_many(["default"], 1)
    proxy.break_()
    healer, healed_at = heal_after(proxy, 1.5)
    queue.release(got, 1.0)
    healer.join()
    [(_, due)] = redis_client.zrange(prefix + "default:delayed", 0, -1, withscores=True)
    assert due >= healed_at[0] + 1.0, "the backoff was spent waiting for the server"


def test_an_outage_longer_than_the_reservation_runs_no_job_twice(
    proxy: Proxy, make: Callable[..., RedisQueue], redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    gate = _GATES[prefix] = threading.Event()
    registry = JobRegistry().with_job(Gated)
    driver = make(proxy.url, reservation=2, **RIDE_OUT)
    driver._blocking_reads = False  # idle on the wake-up subscription alone: its socket is the one left open
    manager = QueueManager({"redis": driver}, registry=registry, container=jobs.container(redis_url))
    producer = QueueManager({"redis": make(redis_url)}, registry=registry)
    reclaimer = make(redis_url, reservation=2)  # another worker's reclaims, straight to the server
    passes = [0]
    stop = threading.Event()

    def reclaim() -> None:
        while not stop.is_set():
            reclaimer.reclaim_expired()
            passes[0] += 1
            stop.wait(0.02)

    sweeping = threading.Thread(target=reclaim)
    # no renewal or sweep of its own within the test: a renewal would revive a reservation born
    # lapsed before the other worker's sweep saw it, and the first operation to meet the outage
    # must be the reserve
    options = WorkerOptions(queues=["default"], concurrency=2, sleep=5, heartbeat=30, reclaim_interval=60)
    worker = Worker(manager, options=options)
    worker.start()
    try:
        wait_until(lambda: driver._pubsub is not None and bool(driver._waiters), 10, message="the worker to idle")
        threading.Event().wait(0.2)  # past the wait's first look, into its select()
        # The server goes away and every connection but the subscription's is cut, so the
        # notification of the next push reaches the worker and its reserve meets the outage.
        proxy.refuse_new(keep={driver._pubsub.connection._sock.getsockname()[1]})
        healer, _ = heal_after(proxy, 2.5)
        producer.dispatch_many([Gated(prefix, n) for n in range(2)])
        sweeping.start()
        wait_until(lambda: len(ran(redis_client, prefix)) == 2, 30, message="both jobs to start")
        healer.join()
        seen = passes[0]
        wait_until(lambda: passes[0] >= seen + 2, 10, message="two sweeps while the jobs run")
        gate.set()
        wait_until(lambda: reclaimer.size("default") == 0, 30, message="the queue to drain")
    finally:
        gate.set()
        stop.set()
        if sweeping.is_alive():
            sweeping.join(10)
        worker.stop()
        worker.join(30)
        manager.close()
        producer.close()
        del _GATES[prefix]
    assert ran(redis_client, prefix) == {0: 1, 1: 1}, "a job ran twice"


# -- outages: ridden out within the reconnect settings, or reported, bounded, by name -----------


def test_a_200ms_blip_during_a_drain_loses_nothing_and_fails_no_operation(
    proxy: Proxy,
    make: Callable[..., RedisQueue],
    redis_url: str,
    redis_client: redis.Redis,
    prefix: str,
    reported: list[dict[str, Any]],
) -> None:
    total = 3000
    driver = make(proxy.url, reservation=5, reconnect=True)  # the default attempts and backoff
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(redis_url))
    QueueManager({"redis": make(redis_url)}, registry=jobs.registry()).dispatch_many(
        [jobs.Record(prefix, n) for n in range(total)]
    )
    # a reserve cut off by the blip after it ran leaves its jobs to lapse: swept up soon after
    options = WorkerOptions(queues=["default"], concurrency=4, sleep=0.1, reclaim_interval=0.5)
    worker = Worker(manager, options=options)
    worker.start()
    try:
        wait_until(lambda: len(ran(redis_client, prefix)) >= 300, 60, message="the drain to get going")
        connections = proxy.accepted
        proxy.break_()
        threading.Event().wait(0.2)  # the outage itself
        proxy.heal()
        wait_until(lambda: len(ran(redis_client, prefix)) == total, 60, interval=0.05, message="the drain")
    finally:
        worker.stop()
        worker.join(30)
        manager.close()
    assert proxy.accepted > connections, "the worker reconnected"
    assert reported == [], "every operation the blip met succeeded after reconnecting"
    assert set(ran(redis_client, prefix).values()) == {1}


def test_a_frozen_server_fails_a_dispatch_within_its_timeouts_naming_the_connection(
    proxy: Proxy, make: Callable[..., RedisQueue], prefix: str
) -> None:
    driver = make(
        proxy.url,
        connect_timeout_ms=300,
        response_timeout_ms=300,
        reconnect=True,
        reconnect_attempts=2,
        reconnect_max_backoff_ms=100,
    )
    manager = QueueManager({"fast": driver}, registry=jobs.registry())
    manager.dispatch(jobs.Record(prefix, 1))
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(QueueUnavailableError) as caught:
        manager.dispatch(jobs.Record(prefix, 2))
    elapsed = time.monotonic() - started
    budget = 3 * 0.3 + 0.1 + 0.1  # three tries, each cut off by the response timeout, and two pauses
    assert elapsed < budget + SLACK, "bounded by the timeouts and the reconnect settings"
    assert isinstance(caught.value, RedisUnavailableError)
    message = str(caught.value)
    assert "'fast'" in message and f"127.0.0.1:{proxy.port}" in message, message
    assert "Timeout" in message


def test_a_frozen_server_does_not_hang_the_worker(
    proxy: Proxy,
    make: Callable[..., RedisQueue],
    redis_url: str,
    redis_client: redis.Redis,
    prefix: str,
    reported: list[dict[str, Any]],
) -> None:
    driver = make(proxy.url, reservation=2, connect_timeout_ms=300, response_timeout_ms=300)
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(redis_url))
    producer = QueueManager(
        {"redis": make(redis_url, reservation=2)}, registry=jobs.registry(), container=jobs.container(redis_url)
    )
    producer.dispatch_many([jobs.Record(prefix, n) for n in range(50)])
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=0.1))
    worker.start()
    try:
        wait_until(lambda: len(ran(redis_client, prefix)) >= 10, 30, message="the worker to get going")
        proxy.freeze()
        producer.dispatch_many([jobs.Record(prefix, n) for n in range(50, 60)])
        wait_until(
            lambda: any("'redis'" in str(r["error"]) for r in reported),
            0.3 * 3 + SLACK,
            message="the frozen server to be reported by the queue's own operations",
        )
        kinds = {r["exception"].kind for r in reported}
        assert kinds == {"rainier_sync.errors.RedisUnavailableError"}, kinds
        assert all(r["connection"] == "redis" for r in reported)
        # The queue's own operations name its connection; those of its default store (on the
        # same frozen server) name the lock store and where it is.
        store = f"redis lock store (127.0.0.1:{urlsplit(proxy.url).port}/"
        for r in reported:
            assert "'redis'" in str(r["error"]) or store in str(r["error"]), r["error"]
        started = time.monotonic()
        worker.stop(grace=1.0)
        worker.join(30)
        assert time.monotonic() - started < 1.0 + 10 * 0.3 + SLACK, "stopping is bounded by the timeouts too"
    finally:
        worker.stop()
        worker.join(30)
        proxy.heal()
        manager.close()
    # nothing accepted was lost: what the frozen worker held runs once its reservation lapses
    rest = Worker(producer, options=WorkerOptions(queues=["default"], concurrency=2, sleep=0.1, reclaim_interval=0.2))
    rest.start()
    try:
        wait_until(lambda: len(ran(redis_client, prefix)) == 60, 30, message="every job to run")
    finally:
        rest.stop()
        rest.join(30)
        producer.close()


OPERATIONS: dict[str, Callable[[RedisQueue, Any], object]] = {
    "push": lambda q, held: q.push(job()),
    "push_many": lambda q, held: q.push_many([job(), job()]),
    "reserve_many": lambda q, held: q.reserve_many(["default"], 5),
    "acknowledge_and_reserve": lambda q, held: q.acknowledge_and_reserve([held], ["default"], 5),
    "release": lambda q, held: q.release(held, 0),
    "give_back": lambda q, held: q.give_back([held]),
    "fail": lambda q, held: q.fail(held, "boom"),
    "extend": lambda q, held: q.extend([held]),
    "reclaim_expired": lambda q, held: q.reclaim_expired(),
    "counts": lambda q, held: q.counts("default"),
    "size": lambda q, held: q.size(),
    "queue_names": lambda q, held: q.queue_names(),
    "failed_jobs": lambda q, held: q.failed_jobs(),
    "failed_count": lambda q, held: q.failed_count(),
    "retry_failed": lambda q, held: q.retry_failed("some-id"),
    "forget_failed": lambda q, held: q.forget_failed("some-id"),
    "check_eviction_policy": lambda q, held: q.check_eviction_policy(),
}


@pytest.mark.parametrize("reconnect", [False, True], ids=["plain", "reconnect"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_server_that_is_down_is_queue_unavailable_naming_the_connection(
    operation: str, reconnect: bool, proxy: Proxy, make: Callable[..., RedisQueue], prefix: str
) -> None:
    options: dict[str, Any] = {"reconnect": True, "reconnect_attempts": 2, "reconnect_max_backoff_ms": 50}
    timeouts: dict[str, Any] = {"connect_timeout_ms": 500, "response_timeout_ms": 500}
    queue = make(proxy.url, reservation=30, **timeouts, **(options if reconnect else {}))
    QueueManager({"fast": queue}, registry=jobs.registry())  # binds the name
    queue.push(job())
    (held,) = queue.reserve_many(["default"], 1)
    proxy.break_()
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError) as caught:
        OPERATIONS[operation](queue, held)
    assert time.monotonic() - started < 3 * 0.5 + SLACK
    message = str(caught.value)
    assert "'fast'" in message and f"127.0.0.1:{proxy.port}" in message, message
    assert isinstance(caught.value.__cause__, (redis.ConnectionError, redis.TimeoutError, OSError))


# -- the lock store ----------------------------------------------------------------------------


@pytest.fixture
def locks(proxy: Proxy, prefix: str) -> Iterator[Callable[..., RedisLockStore]]:
    made: list[RedisLockStore] = []

    def build(**options: Any) -> RedisLockStore:
        store = RedisLockStore.from_url(proxy.url, prefix=prefix + "lock:", **options)
        made.append(store)
        return store

    yield build
    for store in made:
        store.close()


LOCK_OPERATIONS: dict[str, Callable[[RedisLockStore], object]] = {
    "acquire": lambda s: s.acquire("k", "me", 30),
    "release": lambda s: s.release("k", "me"),
    "renew": lambda s: s.renew("k", "me", 30),
    "acquire_many": lambda s: s.acquire_many([("k", "me"), ("l", "me")], 30),
    "renew_many": lambda s: s.renew_many([("k", "me")], 30),
    "owner": lambda s: s.owner("k"),
}


@pytest.mark.parametrize("operation", list(LOCK_OPERATIONS))
def test_a_frozen_server_fails_each_lock_operation_within_its_timeouts_naming_the_store(
    operation: str, proxy: Proxy, locks: Callable[..., RedisLockStore]
) -> None:
    store = locks(connect_timeout_ms=300, response_timeout_ms=300, reconnect=True, reconnect_attempts=1)
    assert store.owner("k") is None  # connected
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(QueueUnavailableError) as caught:
        LOCK_OPERATIONS[operation](store)
    assert time.monotonic() - started < 2 * 0.3 + 0.1 + SLACK
    assert isinstance(caught.value, RedisUnavailableError)
    assert "lock store" in str(caught.value) and f"127.0.0.1:{proxy.port}" in str(caught.value)


def test_a_lock_taken_by_a_try_whose_reply_was_lost_is_reported_taken(
    proxy: Proxy, locks: Callable[..., RedisLockStore], redis_client: redis.Redis, prefix: str
) -> None:
    store = locks(response_timeout_ms=2000, reconnect=True, reconnect_attempts=5, reconnect_max_backoff_ms=50)
    assert store.owner("k") is None
    proxy.deafen()
    outcome: list[bool] = []
    taking = threading.Thread(target=lambda: outcome.append(store.acquire("k", "me", 30)))
    taking.start()
    wait_until(lambda: redis_client.get(prefix + "lock:k") == b"me", 10, message="the SET to run")
    proxy.break_()  # its reply is lost with the connection
    proxy.heal()
    taking.join(20)
    assert outcome == [True], "the lock is ours: the try that took it lost only its reply"
    assert not store.acquire("k", "someone else", 30)
    assert not store.acquire("k", "me", 30), "a fresh acquire of a held lock is still refused"


def test_a_200ms_blip_is_ridden_out_by_the_lock_store_with_reconnect(
    proxy: Proxy, locks: Callable[..., RedisLockStore]
) -> None:
    store = locks(reconnect=True)
    assert store.acquire("k", "me", 30)
    proxy.break_()
    healer, _ = heal_after(proxy, 0.2)
    assert store.renew("k", "me", 30)
    healer.join()
    assert store.owner("k") == "me"
