"""Booting builds each driver from its own declaration, against the real
server: every declared setting reaches the driver, and a job dispatched
through the booted manager is stored where the declaration says."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from rainier_sync import JobRegistry, QueueManager, QueueResources
from rainier_sync.drivers.spec import driver_spec
from rainier_sync.locks import MemoryLockStore

from .conftest import Ping


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    redis = pytest.importorskip("redis")
    prefix = f"rstest:cfg:{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_a_redis_connection_gets_every_declared_setting(
    redis_url: str, redis_prefix: str, registry: JobRegistry
) -> None:
    declaration: dict[str, Any] = {
        "driver": "redis",
        "url": redis_url,
        "prefix": redis_prefix,
        "reservation": 45,
        "connect_timeout_ms": 2000,
        "response_timeout_ms": 1500,
        "reconnect": True,
        "reconnect_attempts": 2,
        "reconnect_max_backoff_ms": 500,
    }
    manager = QueueManager.from_config({"connections": {"fast": declaration}}, registry=registry, environ={})
    try:
        driver: Any = manager.connection("fast")
        assert (driver.prefix, driver.reservation) == (redis_prefix, 45)
        pool = driver._client.connection_pool.connection_kwargs if hasattr(driver, "_client") else None
        if pool is not None:
            assert (pool["socket_connect_timeout"], pool["socket_timeout"]) == (2.0, 1.5)
        job_id = manager.dispatch(Ping(n=1))
        reserved = driver.reserve(["default"])
        assert reserved is not None and reserved.id == job_id
        driver.acknowledge(reserved)
    finally:
        manager.close()


def test_redis_from_the_environment(redis_url: str, redis_prefix: str, registry: JobRegistry) -> None:
    environ = {"QUEUE_DRIVER": "redis", "REDIS_URL": redis_url, "REDIS_QUEUE_PREFIX": redis_prefix,
               "QUEUE_RESERVATION": "75"}  # fmt: skip
    manager = QueueManager.from_env(registry=registry, environ=environ)
    try:
        driver: Any = manager.connection("redis")
        assert (driver.prefix, driver.reservation) == (redis_prefix, 75)
        manager.dispatch(Ping(n=2))
        assert driver.size("default") == 1
    finally:
        manager.close()


def test_two_connections_on_one_redis_server_share_nothing(
    redis_url: str, redis_prefix: str, registry: JobRegistry
) -> None:
    section = {
        "default": "a",
        "connections": {
            "a": {"driver": "redis", "url": redis_url, "prefix": redis_prefix + "a:"},
            "b": {"driver": "redis", "url": redis_url, "prefix": redis_prefix + "b:"},
        },
    }
    manager = QueueManager.from_config(section, registry=registry, environ={})
    try:
        manager.pending(Ping(n=3)).on_connection("b").send()
        assert (manager.connection("a").size("default"), manager.connection("b").size("default")) == (0, 1)
    finally:
        manager.close()


def test_a_database_connection_on_sqlite(tmp_path: Path, registry: JobRegistry) -> None:
    pytest.importorskip("rainier_sync.drivers.database")
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    manager = QueueManager.from_config(
        {"connections": {"db": {"driver": "database", "reservation": 30}}},
        registry=registry,
        environ={"DATABASE_URL": url},
    )
    try:
        driver: Any = manager.connection("db")
        assert driver.reservation == 30
        driver.migrate()
        job_id = manager.dispatch(Ping(n=4))
        reserved = driver.reserve(["default"])
        assert reserved is not None and reserved.id == job_id
    finally:
        manager.close()


def test_queue_resources_database_wins_over_nothing_else(tmp_path: Path, registry: JobRegistry) -> None:
    pytest.importorskip("rainier_sync.drivers.database")
    url = f"sqlite:///{tmp_path / 'resource.db'}"
    manager = QueueManager.from_env(
        registry=registry, resources=QueueResources(database=url), environ={"QUEUE_DRIVER": "database"}
    )
    try:
        manager.connection().migrate()  # type: ignore[attr-defined]
        manager.dispatch(Ping(n=5))
        assert manager.connection().size("default") == 1
        assert (tmp_path / "resource.db").exists()
    finally:
        manager.close()


def test_an_sqs_connection_gets_every_declared_setting(
    sqs_endpoint: str, sqs_client: Any, registry: JobRegistry
) -> None:
    from tests.services.moto import unique_queue_name

    url, mail, failed = (
        sqs_client.create_queue(QueueName=unique_queue_name(name))["QueueUrl"] for name in ("cfg", "mail", "dead")
    )
    declaration = {
        "driver": "sqs",
        "queue_url": url,
        "queue_urls": {"mail": mail},
        "failed_queue_url": failed,
        "endpoint": sqs_endpoint,
        "region": "us-east-1",
        "key": "testing",
        "secret": "testing",
        "visibility_timeout": 40,
        "wait_time": 0,
    }
    manager = QueueManager.from_config({"connections": {"bulk": declaration}}, registry=registry, environ={})
    try:
        driver: Any = manager.connection()
        assert (driver.reservation, driver.wait_time, driver.region) == (40, 0, "us-east-1")
        assert driver.queue_urls == {"default": url, "mail": mail} and driver.failed_queue_url == failed
        manager.dispatch_on("mail", Ping(n=6))
        reserved = driver.reserve(["mail"])
        assert reserved is not None and reserved.payload == {"n": 6}
        driver.acknowledge(reserved)
    finally:
        manager.close()


def test_sqs_from_the_environment_with_the_default_visibility(
    sqs_endpoint: str, sqs_client: Any, registry: JobRegistry
) -> None:
    from tests.services.moto import unique_queue_name

    url, failed = (sqs_client.create_queue(QueueName=unique_queue_name(n))["QueueUrl"] for n in ("env", "envdead"))
    environ = {
        "QUEUE_DRIVER": "sqs",
        "SQS_QUEUE_URL": url,
        "SQS_FAILED_QUEUE_URL": failed,
        "SQS_ENDPOINT": sqs_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    manager = QueueManager.from_env(registry=registry, environ=environ)
    try:
        driver: Any = manager.connection("sqs")
        assert driver.reservation == driver_spec("sqs").default_period  # type: ignore[union-attr]
        manager.dispatch(Ping(n=7))
        reserved = driver.reserve(["default"])
        assert reserved is not None and reserved.payload == {"n": 7}
        driver.acknowledge(reserved)
    finally:
        manager.close()


def test_a_kafka_connection_gets_every_declared_setting(kafka_brokers: str, registry: JobRegistry) -> None:
    tag = uuid.uuid4().hex[:8]
    declaration = {
        "driver": "kafka",
        "brokers": [kafka_brokers],
        "group": f"cfg-{tag}",
        "topic_prefix": f"cfg-{tag}.",
        "lease": 20,
    }
    locks = MemoryLockStore()
    manager = QueueManager.from_config(
        {"connections": {"events": declaration}},
        registry=registry,
        resources=QueueResources(locks=locks),
        environ={},
    )
    try:
        driver: Any = manager.connection()
        assert (driver.brokers, driver.group, driver.topic_prefix, driver.reservation) == (
            kafka_brokers,
            f"cfg-{tag}",
            f"cfg-{tag}.",
            20,
        )
        assert manager.locks is locks
        assert manager.dispatch(Ping(n=8)) is not None
    finally:
        manager.close()
