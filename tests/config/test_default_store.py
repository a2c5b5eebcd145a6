"""Every host builds its manager with the same default lock store: the one in
the default connection's own backend (QueueManager(...), from_env, from_config,
the Flask extension), a store given in QueueResources winning; on SQS none."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from rainier_sync import ConfigurationError, JobRegistry, QueueManager, QueueResources
from rainier_sync.locks import MemoryLockStore


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    redis = pytest.importorskip("redis")
    tag = f"rstest:cfg:{uuid.uuid4().hex[:10]}:"
    yield tag + "queue:"
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=tag + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_from_env_on_memory_keeps_coordination_in_a_memory_store(registry: JobRegistry) -> None:
    manager = QueueManager.from_env(registry=registry, environ={"QUEUE_DRIVER": "memory"})
    assert isinstance(manager.locks, MemoryLockStore)
    manager.pause("default")
    assert manager.paused() == {"default"}


def test_from_config_on_sqlite_keeps_it_in_the_queues_database(tmp_path: Path, registry: JobRegistry) -> None:
    from rainier_sync.locks import DatabaseLockStore

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    section = {"connections": {"db": {"driver": "database"}}}
    manager = QueueManager.from_config(section, registry=registry, environ={"DATABASE_URL": url})
    try:
        driver: Any = manager.connection("db")
        driver.migrate()  # queue:migrate's migrations: the lock tables come with them
        assert isinstance(manager.locks, DatabaseLockStore)
        manager.pause("mail")
        again = QueueManager.from_config(section, registry=registry, environ={"DATABASE_URL": url})
        try:
            assert again.paused() == {"mail"}, "kept in the database, where every process reads it"
        finally:
            again.close()
    finally:
        manager.close()


def test_from_env_on_redis_keeps_it_on_the_queues_server_under_its_lock_prefix(
    redis_url: str, redis_prefix: str, registry: JobRegistry
) -> None:
    from rainier_sync.locks import RedisLockStore

    environ = {"QUEUE_DRIVER": "redis", "REDIS_URL": redis_url, "REDIS_QUEUE_PREFIX": redis_prefix}
    manager = QueueManager.from_env(registry=registry, environ=environ)
    try:
        store = manager.locks
        assert isinstance(store, RedisLockStore)
        assert store._prefix == redis_prefix.removesuffix("queue:") + "lock:"
        manager.pause("mail")
        # What an explicit store on the same server and prefix sees: one state, however it was built.
        explicit = RedisLockStore.from_url(redis_url, prefix=store._prefix)
        try:
            assert explicit.flags("paused:redis") == {"mail"}
        finally:
            explicit.close()
    finally:
        manager.close()


def test_the_lock_prefix_of_a_redis_queue() -> None:
    from rainier_sync.locks import lock_prefix

    assert lock_prefix("rainier:queue:") == "rainier:lock:", "the RedisLockStore's own default"
    assert lock_prefix("app:queue:") == "app:lock:"
    assert lock_prefix("queue:") == "lock:"
    assert lock_prefix("app:") == "app:lock:"
    assert lock_prefix("app:queue:x:") == "app:queue:x:lock:"


def test_a_store_in_queue_resources_wins(registry: JobRegistry) -> None:
    store = MemoryLockStore()
    manager = QueueManager.from_env(
        registry=registry, environ={"QUEUE_DRIVER": "memory"}, resources=QueueResources(locks=store)
    )
    assert manager.locks is store


def test_from_config_on_sqs_has_no_store_and_says_so(sqs_endpoint: str, registry: JobRegistry) -> None:
    from tests.services.moto import REGION, sqs_client_for, unique_queue_name

    client = sqs_client_for(sqs_endpoint)
    url, failed = (client.create_queue(QueueName=unique_queue_name(n))["QueueUrl"] for n in ("default", "failed"))
    declaration = {"driver": "sqs", "queue_url": url, "failed_queue_url": failed, "endpoint": sqs_endpoint,
                   "region": REGION, "key": "testing", "secret": "testing"}  # fmt: skip
    manager = QueueManager.from_config({"connections": {"jobs": declaration}}, registry=registry, environ={})
    try:
        assert manager.locks is None
        with pytest.raises(ConfigurationError, match=r"connection 'jobs' \(sqs\) has no backend.*locks="):
            manager.workers()
    finally:
        manager.close()


def test_the_flask_extension_boots_the_same_default(tmp_path: Path, registry: JobRegistry) -> None:
    pytest.importorskip("flask")
    from rainier_sync.flask import RainierSync
    from rainier_sync.locks import DatabaseLockStore

    memory = RainierSync.boot({"QUEUE_DRIVER": "memory"}, registry=registry)
    assert isinstance(memory.locks, MemoryLockStore)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    section = {"connections": {"db": {"driver": "database"}}}
    database = RainierSync.boot({"RAINIER_QUEUES": section, "DATABASE_URL": url}, registry=registry)
    try:
        assert isinstance(database.locks, DatabaseLockStore)
    finally:
        database.close()
    store = MemoryLockStore()
    nothing = RainierSync.boot({}, registry=registry, resources=QueueResources(locks=store))
    assert nothing.locks is store


def test_a_manager_with_no_connection_has_no_store(registry: JobRegistry) -> None:
    manager = QueueManager.from_env(registry=registry, environ={})
    assert manager.locks is None
    with pytest.raises(ConfigurationError, match="no default connection.*locks="):
        manager.workers()


def test_a_redis_queues_store_shares_its_client_and_reconnect_settings(redis_url: str, redis_prefix: str) -> None:
    from rainier_sync.drivers import RedisQueue
    from rainier_sync.locks import RedisLockStore

    queue = RedisQueue.from_url(redis_url, prefix=redis_prefix, reconnect=True, reconnect_attempts=5)
    manager = QueueManager({"fast": queue})
    store = manager.locks
    assert isinstance(store, RedisLockStore)
    assert store._client is queue.client and store._policy is queue._policy
    assert queue.counts_batches_of(store), "on the queue's own server: batches counted with acknowledgements"
    manager.pause("mail")
    assert manager.paused() == {"mail"}
    manager.close()  # the queue and the store it lends close once each, without an error
