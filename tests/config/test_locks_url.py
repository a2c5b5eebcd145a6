"""``QUEUE_LOCKS_URL`` (the environment, Flask's ``app.config``, Django's settings)
and a section's ``locks`` name the manager's lock store by URL: Redis or a
database, built by the boot, for an app whose default connection's backend
holds none (SQS) or that keeps it elsewhere."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rainier_sync import ConfigurationError, Connections, JobRegistry, QueueManager, QueueResources
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore


def _seen_by_another_process(store: Any, connection: str, queue: str) -> bool:
    """Whether a manager over ``store`` built elsewhere sees ``queue`` of ``connection`` paused."""
    other = QueueManager(connections={connection: MemoryQueue()}, locks=store)
    try:
        return queue in other.paused()
    finally:
        other.close()


def test_flask_app_config_gives_an_sqs_app_its_redis_store(sqs_endpoint: str, redis_url: str,
                                                           registry: JobRegistry) -> None:  # fmt: skip
    pytest.importorskip("flask")
    from rainier_sync.flask import RainierSync
    from rainier_sync.locks import RedisLockStore
    from tests.services.moto import REGION, sqs_client_for, unique_queue_name

    client = sqs_client_for(sqs_endpoint)
    url, failed = (client.create_queue(QueueName=unique_queue_name(n))["QueueUrl"] for n in ("default", "failed"))
    config = {
        "QUEUE_DRIVER": "sqs", "SQS_QUEUE_URL": url, "SQS_FAILED_QUEUE_URL": failed, "SQS_ENDPOINT": sqs_endpoint,
        "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "QUEUE_LOCKS_URL": redis_url,
    }  # fmt: skip
    manager = RainierSync.boot(config, registry=registry)
    queue = f"q-{uuid.uuid4().hex[:12]}"
    try:
        assert isinstance(manager.locks, RedisLockStore)
        manager.pause(queue)
        elsewhere = RedisLockStore.from_url(redis_url)
        assert _seen_by_another_process(elsewhere, "sqs", queue), "kept in Redis, where every process reads it"
        manager.resume(queue)
    finally:
        manager.close()


def test_the_environment_names_a_database_store(tmp_path: Path, registry: JobRegistry) -> None:
    from rainier_sync.locks import DatabaseLockStore

    url = f"sqlite:///{tmp_path / 'locks.db'}"
    DatabaseLockStore.from_url(url).migrate()
    env = {"QUEUE_DRIVER": "memory", "QUEUE_LOCKS_URL": url}
    manager = QueueManager.from_env(registry=registry, environ=env)
    try:
        assert isinstance(manager.locks, DatabaseLockStore)
        manager.pause("mail")
        assert _seen_by_another_process(DatabaseLockStore.from_url(url), "memory", "mail")
    finally:
        manager.close()


def test_a_section_names_a_postgresql_store(request: pytest.FixtureRequest, registry: JobRegistry) -> None:
    from rainier_sync.locks import DatabaseLockStore
    from tests.drivers.database.support import postgres_schema_url

    url = postgres_schema_url(request)
    queue = f"q-{uuid.uuid4().hex[:12]}"
    section = {"connections": {"jobs": {"driver": "memory"}}, "locks": url}
    manager = QueueManager.from_config(section, registry=registry, environ={})
    try:
        assert isinstance(manager.locks, DatabaseLockStore)
        manager.pause(queue)
        assert _seen_by_another_process(DatabaseLockStore.from_url(url), "jobs", queue)
        manager.resume(queue)
    finally:
        manager.close()
    assert Connections.from_dict(section).to_dict()["locks"] == url


def test_a_toml_section_names_a_redis_store(tmp_path: Path, redis_url: str, registry: JobRegistry) -> None:
    pytest.importorskip("redis")
    from rainier_sync.locks import RedisLockStore

    path = tmp_path / "queues.toml"
    path.write_text(f'[queues]\nlocks = "{redis_url}"\n\n[queues.connections.jobs]\ndriver = "memory"\n')
    manager = QueueManager.from_config(path, registry=registry, environ={})
    try:
        assert isinstance(manager.locks, RedisLockStore)
        queue = f"q-{uuid.uuid4().hex[:12]}"
        manager.pause(queue)
        assert manager.paused() == {queue}
        manager.resume(queue)
    finally:
        manager.close()


@pytest.mark.parametrize("url", ["memcached://127.0.0.1:11211", "127.0.0.1:6379", "sqlite://"])
def test_a_bad_url_fails_the_boot_naming_the_variable(url: str, registry: JobRegistry) -> None:
    with pytest.raises(ConfigurationError, match=r"QUEUE_LOCKS_URL"):
        QueueManager.from_env(registry=registry, environ={"QUEUE_DRIVER": "memory", "QUEUE_LOCKS_URL": url})


def test_a_bad_url_in_flask_config_fails_init_app_naming_the_key(registry: JobRegistry) -> None:
    pytest.importorskip("flask")
    from flask import Flask

    from rainier_sync.flask import RainierSync

    app = Flask("bad_locks")
    app.config.update(QUEUE_DRIVER="memory", QUEUE_LOCKS_URL="memcached://127.0.0.1")
    with pytest.raises(ConfigurationError, match=r"QUEUE_LOCKS_URL='memcached://127.0.0.1' is not a lock store URL"):
        RainierSync(app, registry=registry, dashboard_url=None)


def test_a_bad_section_locks_names_the_file_and_line(tmp_path: Path, registry: JobRegistry) -> None:
    path = tmp_path / "queues.toml"
    path.write_text('[queues]\nlocks = 5\n\n[queues.connections.jobs]\ndriver = "memory"\n')
    with pytest.raises(ConfigurationError, match=r"queues.toml, line 2: locks must be the lock store's URL"):
        QueueManager.from_config(path, registry=registry, environ={})


def test_a_store_given_twice_is_refused(registry: JobRegistry) -> None:
    env = {"QUEUE_DRIVER": "memory", "QUEUE_LOCKS_URL": "redis://127.0.0.1:6379/0"}
    with pytest.raises(ConfigurationError, match=r"given twice \(QUEUE_LOCKS_URL and QueueResources.locks\)"):
        QueueManager.from_env(environ=env, resources=QueueResources(registry=registry, locks=MemoryLockStore()))
    section = {"connections": {"jobs": {"driver": "memory"}}, "locks": "redis://127.0.0.1:6379/0"}
    with pytest.raises(ConfigurationError, match=r"given twice \(locks and QUEUE_LOCKS_URL\)"):
        QueueManager.from_config(section, registry=registry, environ=env | {"QUEUE_DRIVER": ""})


def test_flask_refuses_queue_locks_url_beside_an_explicit_manager() -> None:
    pytest.importorskip("flask")
    from flask import Flask

    from rainier_sync.flask import RainierSync

    app = Flask("explicit")
    app.config["QUEUE_LOCKS_URL"] = "redis://127.0.0.1:6379/0"
    manager = QueueManager(connections={"m": MemoryQueue()})
    with pytest.raises(ConfigurationError, match=r"app.config also sets QUEUE_LOCKS_URL"):
        RainierSync(app, manager=manager, dashboard_url=None)


def test_flask_with_no_queue_still_builds_the_named_store(tmp_path: Path) -> None:
    pytest.importorskip("flask")
    from rainier_sync.flask import RainierSync
    from rainier_sync.locks import DatabaseLockStore

    manager = RainierSync.boot({"QUEUE_LOCKS_URL": f"sqlite:///{tmp_path / 'locks.db'}"})
    try:
        assert isinstance(manager.locks, DatabaseLockStore)
    finally:
        manager.close()


def test_kafka_takes_the_store_queue_locks_url_names(kafka_brokers: str, redis_url: str,
                                                      registry: JobRegistry) -> None:  # fmt: skip
    from rainier_sync.locks import RedisLockStore

    env = {"QUEUE_DRIVER": "kafka", "KAFKA_BROKERS": kafka_brokers, "QUEUE_LOCKS_URL": redis_url,
           "KAFKA_TOPIC_PREFIX": f"cfg{uuid.uuid4().hex[:8]}."}  # fmt: skip
    manager = QueueManager.from_env(registry=registry, environ=env)
    try:
        driver: Any = manager.connection("kafka")
        assert isinstance(manager.locks, RedisLockStore)
        assert driver.locks is manager.locks, "its job leases and the manager's state in one store"
    finally:
        manager.close()


def test_the_manager_closes_the_store_the_boot_built(tmp_path: Path, registry: JobRegistry) -> None:
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    manager = QueueManager.from_env(registry=registry, environ={"QUEUE_DRIVER": "memory", "QUEUE_LOCKS_URL": url})
    store: Any = manager.locks
    closed: list[bool] = []
    real_close = store.close
    store.close = lambda: (closed.append(True), real_close())
    manager.close()
    assert closed == [True]


def test_a_connection_that_fails_to_build_closes_the_store_built_before_it(
    tmp_path: Path, registry: JobRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rainier_sync.locks import DatabaseLockStore

    closed: list[object] = []
    real_close = DatabaseLockStore.close

    def close(self: Any) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(DatabaseLockStore, "close", close)
    env = {"QUEUE_DRIVER": "database", "DATABASE_URL": "sqlite:///" + str(tmp_path / "missing" / "jobs.db"),
           "QUEUE_LOCKS_URL": f"sqlite:///{tmp_path / 'locks.db'}"}  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"connection 'database' \(database\): .* does not exist"):
        QueueManager.from_env(registry=registry, environ=env)
    assert len(closed) == 1
