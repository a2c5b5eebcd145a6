"""The Redis driver on a Redis Cluster of three masters the tests start
(tests/services/redis_topologies.py): each queue in one slot, queues spread
over the nodes, the failed store per queue, a slot moved under a running queue.
(The contract suite runs on the cluster too: tests/contract/harness_redis_cluster.py.)"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from freezegun import freeze_time
from redis.cluster import RedisCluster

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import RedisQueue
from rainier_sync.errors import ConfigurationError, PayloadError
from rainier_sync.locks import RedisLockStore
from tests.support import wait_until

from . import jobs
from .test_driver import job

pytestmark = pytest.mark.redis


@pytest.fixture
def cluster_prefix(redis_cluster_url: str) -> Iterator[str]:
    value = f"rscluster:{uuid.uuid4().hex[:12]}:"
    yield value
    client = RedisQueue.from_url(redis_cluster_url).client
    try:
        for key in list(client.scan_iter(match=value + "*", count=1000)):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture
def make(redis_cluster_url: str, cluster_prefix: str) -> Iterator[Callable[..., RedisQueue]]:
    made: list[RedisQueue] = []

    def build(**options: Any) -> RedisQueue:
        queue = RedisQueue.from_url(redis_cluster_url, prefix=cluster_prefix, **options)
        made.append(queue)
        return queue

    yield build
    for queue in made:
        queue.close()


def node_of(client: RedisCluster, key: str) -> str:
    return str(client.get_node_from_key(key).name)


def queues_on_different_nodes(client: RedisCluster, prefix: str, count: int) -> list[str]:
    """``count`` queue names whose keys the cluster puts on ``count`` different nodes (at most 3)."""
    found: dict[str, str] = {}
    for n in range(1000):
        name = f"q{n}"
        node = node_of(client, f"{prefix}{{{name}}}:bands")
        if node not in found:
            found[node] = name
        if len(found) == count:
            return list(found.values())
    raise AssertionError("the cluster's slots are not spread over its nodes")


def slots_by_queue(client: RedisCluster, prefix: str) -> dict[str, set[int]]:
    slots: dict[str, set[int]] = {}
    for raw in client.scan_iter(match=prefix + "*", count=1000):
        key = raw.decode()
        rest = key[len(prefix) :]
        queue = rest[1 : rest.index("}")] if rest.startswith("{") else "(shared)"
        slots.setdefault(queue, set()).add(client.keyslot(key))
    return slots


def test_each_queue_keeps_every_key_in_one_slot_and_queues_spread_over_the_nodes(
    make: Callable[..., RedisQueue], cluster_prefix: str
) -> None:
    queue = make(reservation=30)
    client = queue.client
    a, b = queues_on_different_nodes(client, cluster_prefix, 2)
    with freeze_time("2026-03-01 12:00:00") as frozen:
        for name in (a, b):
            queue.push_many([job(name), job(name, priority=5), job(name, delay=60)])
            held = queue.reserve_many([name], 2)  # reserved, and a stream per band
            queue.fail(held[0], "boom")  # the failed store
            frozen.tick(1)
        assert queue.counts(a).delayed == 1 and queue.counts(b).reserved == 1
    slots = slots_by_queue(client, cluster_prefix)
    assert set(slots) == {a, b, "(shared)"}, slots
    assert len(slots[a]) == 1 and len(slots[b]) == 1, f"a queue's keys are in more than one slot: {slots}"
    assert slots[a] != slots[b]
    assert node_of(client, f"{cluster_prefix}{{{a}}}:bands") != node_of(client, f"{cluster_prefix}{{{b}}}:bands")
    kinds = {raw.decode().split("}:", 1)[1] for raw in client.scan_iter(match=f"{cluster_prefix}{{{a}}}*")}
    assert kinds >= {"ready:0", "ready:5", "bands", "delayed", "reserved", "failed", "failed:index"}
    assert [k.decode() for k in client.scan_iter(match=cluster_prefix + "[^{]*")] == [cluster_prefix + "queues"]
    assert queue.queue_names() == sorted([a, b])


def test_a_worker_drains_several_queues_spread_over_the_nodes(
    make: Callable[..., RedisQueue], redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    driver = make(reservation=30)
    names = queues_on_different_nodes(driver.client, driver.prefix, 3) + ["extra-1", "extra-2"]
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(redis_url))
    built = []
    for i, name in enumerate(names):
        for n in range(201):
            pending = manager.pending(jobs.Record(prefix, len(built))).on_queue(name)
            built.append(pending.priority(-1 - i if n == 200 else 0).build()[1])  # and another band
    driver.push_many(built)
    total = len(built)
    stats = Worker(manager, options=WorkerOptions(queues=names, concurrency=8, once=True)).run()
    runs = {int(k): int(v) for k, v in redis_client.hgetall(prefix + "ran").items()}
    assert stats.processed == total
    assert len(runs) == total and set(runs.values()) == {1}, "a job ran twice, or never"
    assert all(driver.size(name) == 0 for name in names)
    manager.close()


def test_failed_jobs_of_several_queues_list_newest_first_and_retry_onto_their_queue(
    make: Callable[..., RedisQueue],
) -> None:
    queue = make(reservation=30)
    names = queues_on_different_nodes(queue.client, queue.prefix, 3)
    with freeze_time("2026-03-01 12:00:00") as frozen:
        failed = []
        for name in names * 2:
            queue.push(job(name))
            (held,) = queue.reserve_many([name], 1)
            failed.append(queue.fail(held, f"failed on {name}"))
            frozen.tick(1)
    assert queue.failed_count() == 6
    listed = queue.failed_jobs(4)
    assert [f.id for f in listed] == [f.id for f in reversed(failed)][:4], "newest first, across the queues"
    assert [f.queue for f in listed] == [names[2], names[1], names[0], names[2]]
    assert queue.retry_failed(failed[0].id) is True
    assert queue.retry_failed(failed[0].id) is False, "retried once"
    (again,) = queue.reserve_many([names[0]], 5)
    assert again.id == failed[0].id
    assert queue.forget_failed(failed[1].id) is True and queue.forget_failed(failed[1].id) is False
    assert queue.failed_count() == 4


def test_an_idle_worker_is_woken_for_every_queue_it_reads_on_any_node(
    make: Callable[..., RedisQueue], redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    driver, producer = make(reservation=30), make(reservation=30)
    first, second = queues_on_different_nodes(driver.client, driver.prefix, 2)
    for name in (first, second):  # their streams exist: the blocking read names the first queue's
        producer.push(job(name))
        driver.acknowledge_many(driver.reserve_many([name], 1))
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(redis_url))
    producing = QueueManager({"redis": producer}, registry=jobs.registry())
    worker = Worker(manager, options=WorkerOptions(queues=[first, second], concurrency=2, sleep=30))
    worker.start()
    try:
        for n, name in enumerate([second, first, second]):
            wait_until(lambda: bool(driver._waiters), 10, message="the worker to idle")
            started = time.monotonic()
            producing.pending(jobs.Record(prefix, n)).on_queue(name).send()
            wait_until(lambda n=n: redis_client.hexists(prefix + "ran", str(n)), 10, message=f"job {n} on {name}")
            assert time.monotonic() - started < 5, "woken by the push, not by the end of the 30 s sleep"
    finally:
        worker.stop()
        worker.join(10)
        manager.close()
        producing.close()


def _move_slot(client: RedisCluster, slot: int) -> None:
    """Migrate ``slot`` and its keys to another master (what ``redis-cli --cluster reshard`` does)."""
    nodes = {node.name: node for node in client.get_primaries()}
    source = client.nodes_manager.slots_cache[slot][0]
    target = next(node for name, node in nodes.items() if name != source.name)
    src, dst = source.redis_connection, target.redis_connection
    src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
    for node in nodes.values():
        node.redis_connection.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def test_a_queue_whose_slot_moves_to_another_node_is_followed_there(
    make: Callable[..., RedisQueue], cluster_prefix: str
) -> None:
    queue = make(reservation=30)
    producer = make(reservation=30)
    name = "moving"
    producer.push_many([job(name) for _ in range(20)])
    first = queue.reserve_many([name], 5)
    queue.acknowledge_many(first[:3])  # sent; its reply is read with the next reply on that node
    slot = queue.client.keyslot(f"{cluster_prefix}{{{name}}}:bands")
    before = queue.client.nodes_manager.slots_cache[slot][0].name
    _move_slot(queue.client, slot)
    queue.acknowledge_many(first[3:])
    producer.push(job(name))  # the producers' connection meets MOVED too
    rest = queue.reserve_many([name], 100)
    queue.acknowledge_many(rest)
    assert len(rest) == 16
    assert queue.size(name) == 0
    assert queue.client.nodes_manager.slots_cache[slot][0].name != before


def test_queue_names_and_prefixes_that_would_break_the_hash_tag_are_refused(
    redis_cluster_url: str, make: Callable[..., RedisQueue]
) -> None:
    with pytest.raises(ConfigurationError, match="prefix 'app:{x}:' holds a brace"):
        RedisQueue.from_url(redis_cluster_url, prefix="app:{x}:")
    queue = make()
    with pytest.raises(PayloadError, match="queue 'a}b'.*may not hold"):
        queue.push(job("a}b"))
    with pytest.raises(PayloadError, match="queue '{a'"):
        queue.push_many([job("fine"), job("{a")])
    assert queue.queue_names() == [], "nothing of the batch was stored"


def test_the_lock_store_on_a_cluster_keeps_each_pair_of_keys_in_one_slot(redis_cluster_url: str) -> None:
    prefix = f"rscluster:{uuid.uuid4().hex[:12]}:lock:"
    store = RedisLockStore.from_url(redis_cluster_url, prefix=prefix)
    try:
        assert store.acquire("unique:a", "me", 30) and not store.acquire("unique:a", "you", 30)
        assert store.acquire_many([("unique:b", "me"), ("unique:c", "me")], 30) == [True, True]
        assert store.renew_many([("unique:b", "me"), ("unique:c", "you")], 30) == [True, False]
        assert store.release("unique:a", "me")
        for key in ("batch-1", "batch-2", "batch-3"):
            store.tally_add(key, {"pending": 2}, 60)
            counts, new = store.tally_settle(key, "job-1", "done", 60)
            assert new and counts == {"pending": 1, "done": 1}
        store.put_value("result-1", "42", 60)
        assert store.get_value("result-1") == "42"
        assert store.wait_value("result-1", 1.0, lambda value: value is not None) == "42"
        client = store._client
        by_tag: dict[str, set[int]] = {}
        for raw in client.scan_iter(match=prefix + "*"):
            key = raw.decode()
            if "{" in key:
                by_tag.setdefault(key[key.index("{") : key.index("}") + 1], set()).add(client.keyslot(key))
        assert by_tag and all(len(slots) == 1 for slots in by_tag.values()), by_tag
    finally:
        client = store._client
        for raw in list(client.scan_iter(match=prefix + "*")):
            client.delete(raw)
        store.close()


def test_a_drain_and_a_dispatch_at_once_on_several_threads(make: Callable[..., RedisQueue]) -> None:
    queue = make(reservation=30)
    names = queues_on_different_nodes(queue.client, queue.prefix, 3)
    stop = threading.Event()
    pushed: list[str] = []

    def produce() -> None:
        while not stop.is_set() and len(pushed) < 600:
            batch = [job(names[len(pushed) % 3]) for _ in range(20)]
            queue.push_many(batch)
            pushed.extend(j.id for j in batch)

    producers = [threading.Thread(target=produce) for _ in range(2)]
    for thread in producers:
        thread.start()
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (any(t.is_alive() for t in producers) or len(seen) < len(pushed)):
        got = queue.reserve_many(names, 50)
        queue.acknowledge_many(got)
        seen.update(j.id for j in got)
    stop.set()
    for thread in producers:
        thread.join(10)
    assert seen == set(pushed)
    assert sum(queue.size(name) for name in names) == 0


def test_a_cluster_client_built_elsewhere_is_taken_as_it_is(redis_cluster_url: str, cluster_prefix: str) -> None:
    host, port = redis_cluster_url.split("//", 1)[1].split(",", 1)[0].split(":")
    client = RedisCluster(host=host, port=int(port), protocol=2)
    queue = RedisQueue(client, prefix=cluster_prefix, reservation=30)
    try:
        assert queue.cluster and queue.describe().startswith("redis cluster")
        queue.push_many([job("a"), job("b")])
        assert len(queue.reserve_many(["a", "b"], 5)) == 2
    finally:
        queue.close()
