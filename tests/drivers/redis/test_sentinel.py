"""The Redis driver and lock store on the master a group of sentinels watches
(a master, a replica and three sentinels the tests start:
tests/services/redis_topologies.py), through a forced failover."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from rainier_sync import Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.config import Connections
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.redis import RedisUnavailableError
from rainier_sync.locks import RedisLockStore
from tests.services.redis_topologies import SERVICE, SentinelGroup
from tests.support import free_port, wait_until

from .test_driver import job

pytestmark = pytest.mark.redis

#: Per test: job number -> [(started, ended)] of each run, by time.monotonic().
LEDGER: dict[str, dict[int, list[tuple[float, float]]]] = {}
_LOCK = threading.Lock()


@dataclass
class Ledgered(Job):
    """Runs for a few milliseconds and writes each run in the test's ledger (in this process)."""

    NAME = "redis-tests.ledgered"
    TRIES = 5

    test: str
    n: int

    def handle(self, context: JobContext) -> None:
        started = time.monotonic()
        time.sleep(0.005)
        with _LOCK:
            LEDGER[self.test].setdefault(self.n, []).append((started, time.monotonic()))


@pytest.fixture
def ledger() -> Iterator[tuple[str, dict[int, list[tuple[float, float]]]]]:
    name = uuid.uuid4().hex
    LEDGER[name] = {}
    yield name, LEDGER[name]
    del LEDGER[name]


#: Tries enough to outlast a failover (the master is re-resolved on each).
RIDE_OUT: dict[str, Any] = {
    "reconnect": True,
    "reconnect_attempts": 40,
    "reconnect_max_backoff_ms": 250,
    "connect_timeout_ms": 1000,
    "response_timeout_ms": 2000,
}


def switch_heard(group: SentinelGroup) -> tuple[threading.Thread, list[float], threading.Event]:
    """Listen on the first sentinel for ``+switch-master``; the list gets when it came."""
    heard: list[float] = []
    stop = threading.Event()
    pubsub = redis.Redis(port=group.sentinels[0].port).pubsub()
    pubsub.subscribe("+switch-master")

    def listen() -> None:
        while not stop.is_set() and not heard:
            message = pubsub.get_message(timeout=0.05)
            if message and message["type"] == "message":
                heard.append(time.monotonic())
        pubsub.close()

    thread = threading.Thread(target=listen)
    thread.start()
    return thread, heard, stop


def test_a_queue_and_a_lock_store_work_on_the_master_the_sentinels_name(redis_sentinel_url: str) -> None:
    prefix = f"rssentinel:{uuid.uuid4().hex[:12]}:"
    hosts = redis_sentinel_url.split("//", 1)[1].split("/", 1)[0]
    # a sentinel that is down, first: the next one answers
    url = f"redis+sentinel://127.0.0.1:{free_port()},{hosts}/{SERVICE}/2"
    queue = RedisQueue.from_url(url, prefix=prefix, connect_timeout_ms=500)
    try:
        assert queue.describe().startswith(f"redis sentinel {SERVICE}@")
        queue.push(job())
        (got,) = queue.reserve_many(["default"], 5)
        queue.acknowledge(got)
        assert queue.size("default") == 0
        assert queue.client.connection_pool.connection_kwargs["db"] == 2
    finally:
        for key in list(queue.client.scan_iter(match=prefix + "*")):
            queue.client.delete(key)
        queue.close()
    store = RedisLockStore.from_url(url, prefix=prefix + "lock:", connect_timeout_ms=500)
    try:
        assert store.acquire("a", "me", 30) and not store.acquire("a", "you", 30) and store.release("a", "me")
    finally:
        store.close()


def test_the_sentinels_and_service_name_settings_build_the_same_queue(redis_sentinel_url: str) -> None:
    hosts = redis_sentinel_url.split("//", 1)[1].split("/", 1)[0].split(",")
    prefix = f"rssentinel:{uuid.uuid4().hex[:12]}:"
    connections = Connections.from_dict({"connections": {"fast": {
        "driver": "redis", "sentinels": hosts, "service_name": SERVICE, "url": "redis:///3", "prefix": prefix,
    }}})
    manager = QueueManager.from_config(connections, registry=JobRegistry().with_job(Ledgered))
    try:
        driver: Any = manager.connection("fast")
        assert driver.client.connection_pool.service_name == SERVICE
        assert driver.client.connection_pool.connection_kwargs["db"] == 3
        manager.dispatch(Ledgered("x", 1))
        assert driver.size("default") == 1
        for key in list(driver.client.scan_iter(match=prefix + "*")):
            driver.client.delete(key)
    finally:
        manager.close()


def test_a_forced_failover_mid_drain_loses_no_job_and_repeats_only_what_the_switch_overlapped(
    sentinel_group: SentinelGroup, ledger: tuple[str, dict[int, list[tuple[float, float]]]]
) -> None:
    # ~15 s: the sentinels take a second to announce the new master, and what the
    # old master acknowledged in that second is reclaimed once its reservation lapses.
    # Half the jobs run before the failover: none of those may run again.
    name, runs = ledger
    prefix = f"rssentinel:{uuid.uuid4().hex[:12]}:"
    registry = JobRegistry().with_job(Ledgered)
    old_master = sentinel_group.master_port()
    driver = RedisQueue.from_url(sentinel_group.url, prefix=prefix, reservation=3, **RIDE_OUT)
    producer = RedisQueue.from_url(sentinel_group.url, prefix=prefix, **RIDE_OUT)
    reclaimer = RedisQueue.from_url(sentinel_group.url, prefix=prefix, reservation=3, **RIDE_OUT)
    manager = QueueManager({"redis": driver}, registry=registry)
    producing = QueueManager({"redis": producer}, registry=registry)
    total = 4000
    producing.dispatch_many([Ledgered(name, n) for n in range(total)])
    assert producer.client.wait(1, 5000) == 1, "every job is on the replica before the failover"
    options = WorkerOptions(queues=["default"], concurrency=4, sleep=30, reclaim_interval=0.5)
    worker = Worker(manager, options=options)
    listener, heard, stop_listening = switch_heard(sentinel_group)
    stop = threading.Event()

    def reclaim() -> None:  # another worker's sweeps: an idle worker sweeps only when it wakes
        while not stop.wait(0.2):
            reclaimer.reclaim_expired()

    sweeping = threading.Thread(target=reclaim)
    sweeping.start()
    worker.start()
    try:
        wait_until(lambda: len(runs) >= total // 2, 30, interval=0.002, message="half the drain")
        failed_over_at = time.monotonic()
        sentinel_group.failover()
        wait_until(lambda: bool(heard), 30, message="the sentinels to announce the new master")
        wait_until(lambda: len(runs) == total, 60, interval=0.05, message="every job to run")
        assert sentinel_group.master_port() != old_master
        wait_until(lambda: producer.size("default") == 0, 30, interval=0.1, message="the new master's queue to drain")
        # the idle worker hears of a job dispatched on the new master: its subscription
        # and its blocking read followed the master
        wait_until(lambda: bool(driver._waiters), 10, message="the worker to idle")
        started = time.monotonic()
        producing.dispatch(Ledgered(name, total))
        wait_until(lambda: total in runs, 10, message="the job dispatched after the failover")
        assert time.monotonic() - started < 5, "woken by the push, not by the end of the 30 s sleep"
        assert driver._pubsub.connection.port == sentinel_group.master_port()
    finally:
        stop.set()
        sweeping.join(10)
        reclaimer.close()
        stop_listening.set()
        listener.join(5)
        worker.stop()
        worker.join(30)
        manager.close()
        producing.close()
    assert set(runs) == set(range(total + 1)), "a job was lost"
    switched_at = heard[0]
    twice = sorted(n for n, seen in runs.items() if len(seen) > 1)
    # A job runs again only if the switch overlapped it: its first run ended on the old
    # master between the promotion and the driver hearing of it, or just before the
    # failover with its acknowledgement not yet on the replica.
    window = (failed_over_at - 1.0, switched_at + 2.0)
    outside = [n for n in twice if not window[0] <= runs[n][0][1] <= window[1]]
    assert outside == [], f"{len(outside)} jobs ran twice that the failover did not overlap"
    finished_in_window = sum(1 for seen in runs.values() if window[0] <= seen[0][1] <= window[1])
    assert len(twice) <= finished_in_window
    assert all(len(seen) <= 2 for seen in runs.values())


def test_a_write_that_meets_a_demoted_master_goes_to_the_new_one(sentinel_group: SentinelGroup) -> None:
    prefix = f"rssentinel:{uuid.uuid4().hex[:12]}:"
    old = sentinel_group.master_port()
    queue = RedisQueue.from_url(sentinel_group.url, prefix=prefix, reservation=30, **RIDE_OUT)
    store = RedisLockStore.from_url(sentinel_group.url, prefix=prefix + "lock:", **RIDE_OUT)
    try:
        queue.push(job())
        (first,) = queue.reserve_many(["default"], 5)  # the producers' and the loop's connections are open
        assert store.acquire("held", "me", 60)
        # as a client that never heard the sentinels' announcement: the old master
        # refuses writes once it is a replica, and that refusal moves the connections
        queue._topology._watch = None
        store._topology._watch = None
        sentinel_group.failover()
        wait_until(lambda: sentinel_group.master_port() != old, 30, message="the sentinels to name the new master")
        new = sentinel_group.master_port()
        redis.Redis(port=old).replicaof("127.0.0.1", new)  # what the sentinels do to it some seconds later
        wait_until(lambda: redis.Redis(port=old).info("replication")["master_link_status"] == "up", 30,
                   message="the old master to follow the new one")
        queue.push(job(marker="after"))
        queue.acknowledge(first)
        (after,) = queue.reserve_many(["default"], 5)
        assert after.payload == {"marker": "after"}
        queue.acknowledge(after)
        assert queue.size("default") == 0
        assert store.acquire("fresh", "me", 60) and store.release("held", "me")
        fresh = redis.Redis(port=new)
        assert fresh.get(prefix + "lock:fresh") == b"me", "written on the new master"
    finally:
        queue.close()
        store.close()



def test_a_replica_named_as_the_server_is_reported_unavailable_after_the_retries(redis_sentinel_url: str) -> None:
    first = redis_sentinel_url.split("//", 1)[1].split(",", 1)[0]
    host, port = first.rsplit(":", 1)
    (replica,) = redis.Redis(host=host, port=int(port)).sentinel_slaves(SERVICE)
    url = f"redis://{replica['ip']}:{replica['port']}/0"
    queue = RedisQueue.from_url(url, reconnect=True, reconnect_attempts=2, reconnect_max_backoff_ms=10)
    try:
        with pytest.raises(RedisUnavailableError, match="dispatch failed \\(3 tries\\): ReadOnlyError"):
            queue.push(job())
        with pytest.raises(RedisUnavailableError, match="reserve failed \\(3 tries\\): ReadOnlyError"):
            queue.reserve_many(["default"], 1)
    finally:
        queue.close()


def test_a_sentinel_client_built_elsewhere_is_taken_as_it_is(redis_sentinel_url: str) -> None:
    from redis.sentinel import Sentinel

    hosts = redis_sentinel_url.split("//", 1)[1].split("/", 1)[0].split(",")
    sentinel = Sentinel([(h.split(":")[0], int(h.split(":")[1])) for h in hosts])
    prefix = f"rssentinel:{uuid.uuid4().hex[:12]}:"
    queue = RedisQueue(sentinel.master_for(SERVICE, protocol=2, db=4), prefix=prefix)
    try:
        described = queue.describe()
        assert described.startswith(f"redis sentinel {SERVICE}@") and described.endswith(f"/4 prefix={prefix!r}")
        queue.push(job())
        (got,) = queue.reserve_many(["default"], 5)
        queue.acknowledge(got)
        assert queue.size("default") == 0
    finally:
        queue.close()
