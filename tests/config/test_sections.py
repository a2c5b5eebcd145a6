"""A ``queues`` section from a dict, a JSON file or a TOML file; the Python
builder; the boot rules around it (never both, neither, resources)."""

from __future__ import annotations

import inspect
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest

import rainier_sync
from rainier_sync import (
    ConfigurationError,
    Connections,
    Container,
    JobRegistry,
    NoQueueConfiguredError,
    QueueManager,
    QueueResources,
)
from rainier_sync.drivers import MemoryQueue, SyncQueue
from rainier_sync.drivers.spec import driver_names, driver_spec
from rainier_sync.locks import MemoryLockStore

from .conftest import Ping

SQS = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"

TOML = """\
# the application's own settings live beside the queues
[app]
name = "blog"

[queues]
default = "primary"

[queues.connections.primary]
driver = "memory"
reservation = 120

[queues.connections.bulk]
driver = "memory"
retry_after = 60
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_dict_section_boots_each_connection_from_its_own_declaration(registry: JobRegistry) -> None:
    manager = QueueManager.from_config(
        {
            "default": "fast",
            "connections": {"fast": {"driver": "memory", "reservation": 30}, "slow": {"driver": "memory"}},
        },
        registry=registry,
        environ={},
    )
    assert manager.default == "fast"
    fast, slow = manager.connection("fast"), manager.connection("slow")
    assert isinstance(fast, MemoryQueue) and isinstance(slow, MemoryQueue)
    assert fast is not slow
    assert (fast.reservation, slow.reservation) == (30, 90)
    manager.dispatch(Ping(n=1))
    assert (fast.size(), slow.size()) == (1, 0)


def test_booting_sets_the_process_wide_instance(registry: JobRegistry) -> None:
    manager = QueueManager.from_config({"connections": {"only": {"driver": "memory"}}}, registry=registry, environ={})
    assert rainier_sync.instance() is manager
    assert rainier_sync.dispatch(Ping(n=2)) is not None
    assert manager.connection().size() == 1


def test_a_section_may_sit_under_a_queues_key(registry: JobRegistry) -> None:
    manager = QueueManager.from_config(
        {"queues": {"connections": {"only": {"driver": "memory"}}}}, registry=registry, environ={}
    )
    assert list(manager.connections) == ["only"]


def test_a_toml_file_boots(tmp_path: Path, registry: JobRegistry) -> None:
    path = write(tmp_path, "queues.toml", TOML.replace("retry_after = 60\n", ""))
    manager = QueueManager.from_config(path, registry=registry, environ={})
    assert sorted(manager.connections) == ["bulk", "primary"]
    assert manager.connection("primary").reservation == 120


def test_a_json_file_boots(tmp_path: Path, registry: JobRegistry) -> None:
    section = {"default": "primary", "connections": {"primary": {"driver": "memory", "reservation": 45}}}
    path = write(tmp_path, "queues.json", json.dumps(section, indent=2))
    manager = QueueManager.from_config(str(path), registry=registry, environ={})
    assert manager.connection().reservation == 45


def test_a_refused_setting_in_a_toml_file_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "queues.toml", TOML)
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_config(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"{path}, line 14: connection 'bulk' (memory): 'retry_after' cannot be honoured")
    assert "reservation" in message


def test_an_unknown_key_in_a_json_file_names_the_file_and_line(tmp_path: Path) -> None:
    text = (
        '{\n  "default": "primary",\n  "connections": {\n    "primary": {\n      "driver": "memory",\n'
        '      "reservaton": 30\n    }\n  }\n}\n'
    )
    path = write(tmp_path, "queues.json", text)
    with pytest.raises(ConfigurationError) as caught:
        Connections.load(path)
    assert str(caught.value).startswith(f"{path}, line 6: connection 'primary' (memory): unknown setting 'reservaton'")


def test_malformed_toml_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "queues.toml", '[queues]\ndefault = "primary"\n[queues.connections.primary\ndriver = 1\n')
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_config(path, environ={})
    assert str(caught.value).startswith(f"{path}, line 3: not valid TOML")


def test_malformed_json_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "queues.json", '{\n  "default": "primary",\n  "connections": {,}\n}\n')
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_config(path, environ={})
    assert str(caught.value).startswith(f"{path}, line 3: not valid JSON")


def test_a_missing_file_and_a_wrong_extension_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="queues.toml: queues file not found"):
        QueueManager.from_config(tmp_path / "queues.toml", environ={})
    with pytest.raises(ConfigurationError, match=r"queues.yaml: a queues file must be \.json or \.toml"):
        QueueManager.from_config(write(tmp_path, "queues.yaml", "a: 1"), environ={})


def test_a_json_file_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="queues section must be a mapping"):
        QueueManager.from_config(write(tmp_path, "queues.json", "[1, 2]"), environ={})


def test_a_connection_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="connection 'a': must be a table of settings with a driver"):
        Connections.from_dict({"connections": {"a": "memory"}})


# -- never both, neither ------------------------------------------------------------------------------


def test_queue_driver_and_a_section_together_fail_the_boot() -> None:
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_config({"connections": {"a": {"driver": "memory"}}}, environ={"QUEUE_DRIVER": "memory"})
    assert "QUEUE_DRIVER=memory and a queues section are both set" in str(caught.value)


def test_neither_builds_no_queue_and_dispatch_says_so() -> None:
    manager = QueueManager.from_config(None, environ={})
    assert manager.connections == {}
    assert rainier_sync.instance() is manager
    with pytest.raises(NoQueueConfiguredError, match="no queue is configured: set QUEUE_DRIVER or a queues section"):
        manager.dispatch(Ping())
    with pytest.raises(NoQueueConfiguredError):
        rainier_sync.dispatch(Ping())


def test_an_empty_section_defers_to_queue_driver(registry: JobRegistry) -> None:
    manager = QueueManager.from_config({}, registry=registry, environ={"QUEUE_DRIVER": "memory"})
    assert list(manager.connections) == ["memory"]


# -- resources ------------------------------------------------------------------------------------------


def test_sync_gets_its_registry_and_container_from_resources(registry: JobRegistry) -> None:
    container = Container()
    seen: list[int] = []
    container.instance("seen", seen)
    manager = QueueManager.from_config(
        {"connections": {"inline": {"driver": "sync"}}},
        resources=QueueResources(registry=registry, container=container),
        environ={},
    )
    assert isinstance(manager.connection(), SyncQueue)
    manager.dispatch(Ping(n=7))
    assert seen == [7]


def test_sync_without_a_registry_is_a_boot_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"needs the job registry; pass registry= or QueueResources"):
        QueueManager.from_config({"connections": {"inline": {"driver": "sync"}}}, environ={})


def test_sync_without_a_container_is_a_boot_error_naming_it(registry: JobRegistry) -> None:
    with pytest.raises(ConfigurationError, match=r"needs the container; pass container= or QueueResources"):
        QueueManager.from_config({"connections": {"inline": {"driver": "sync"}}}, registry=registry, environ={})


def test_kafka_without_a_lock_store_is_a_boot_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"kafka needs a shared lock store.*QueueResources\(locks=\.\.\.\)"):
        QueueManager.from_config({"connections": {"k": {"driver": "kafka", "brokers": "127.0.0.1:9092"}}}, environ={})


def test_database_without_a_url_is_a_boot_error_naming_database_url() -> None:
    with pytest.raises(ConfigurationError, match="DATABASE_URL is not set"):
        QueueManager.from_config({"connections": {"db": {"driver": "database"}}}, environ={})


def test_a_database_resource_that_is_not_a_url_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"QueueResources.database must be a database URL"):
        QueueManager.from_config(
            {"connections": {"db": {"driver": "database"}}},
            resources=QueueResources(database=object()),
            environ={},
        )


def test_two_different_registries_are_refused(registry: JobRegistry) -> None:
    with pytest.raises(ConfigurationError, match="two different registry objects were given"):
        QueueManager.from_config(
            {"connections": {"m": {"driver": "memory"}}},
            registry=registry,
            resources=QueueResources(registry=JobRegistry()),
            environ={},
        )


def test_the_lock_store_reaches_the_manager() -> None:
    locks = MemoryLockStore()
    manager = QueueManager.from_config(
        {"connections": {"m": {"driver": "memory"}}}, resources=QueueResources(locks=locks), environ={}
    )
    assert manager.locks is locks


@pytest.mark.parametrize(
    ("driver", "library", "declaration", "environ"),
    [
        ("redis", "redis", {"url": "redis://127.0.0.1:6379/1"}, {}),
        ("sqs", "boto3", {"queue_url": "https://sqs.x/1/j", "failed_queue_url": "https://sqs.x/1/f"}, {}),
        ("kafka", "confluent_kafka", {"brokers": "127.0.0.1:9092"}, {}),
        ("database", "psycopg", {}, {"DATABASE_URL": "postgresql://nobody@127.0.0.1:5432/test"}),
    ],
)
def test_a_driver_whose_extra_is_missing_names_the_driver_and_the_extra(
    monkeypatch: pytest.MonkeyPatch, driver: str, library: str, declaration: dict[str, str], environ: dict[str, str]
) -> None:
    import rainier_sync.drivers as drivers

    # Import the driver again with its client library "not installed"; every
    # module is put back afterwards.
    for name in [n for n in sys.modules if n.startswith((f"rainier_sync.drivers.{driver}", library))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(drivers, driver, getattr(drivers, driver, None), raising=False)
    monkeypatch.setitem(sys.modules, library, None)
    extra = {"database": "postgres"}.get(driver, driver)
    section = {"connections": {"c": {"driver": driver, **declaration}}}
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_config(section, resources=QueueResources(locks=MemoryLockStore()), environ=environ)
    message = str(caught.value)
    assert message.startswith(f"connection 'c' ({driver}): ")
    assert f"pip install 'rainier_sync[{extra}]'" in message


def test_a_driver_missing_from_the_installation_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from rainier_sync.drivers import spec

    spec.driver_names()  # every shipped spec found first, then the kafka one taken away
    monkeypatch.delitem(spec._specs, "kafka")
    with pytest.raises(ConfigurationError, match="driver 'kafka' is not one of sync, memory, database, redis, sqs$"):
        QueueManager.from_config(
            {"connections": {"c": {"driver": "kafka", "brokers": "127.0.0.1:9092"}}},
            resources=QueueResources(locks=MemoryLockStore()),
            environ={},
        )


# -- the builder -----------------------------------------------------------------------------------------


def test_the_builder_checks_each_connection_as_it_is_added() -> None:
    connections = Connections("primary").with_connection("primary", "memory", reservation=timedelta(minutes=2))
    with pytest.raises(ConfigurationError, match="'retry_after' cannot be honoured"):
        connections.with_connection("bulk", "memory", retry_after=60)
    with pytest.raises(ConfigurationError, match="declared twice"):
        connections.with_connection("primary", "memory")
    assert connections.to_dict() == {
        "default": "primary",
        "connections": {"primary": {"driver": "memory", "reservation": 120}},
    }


def test_the_builder_round_trips_through_a_dict_and_boots(registry: JobRegistry) -> None:
    built = (
        Connections("primary").with_connection("primary", "memory", reservation=60).with_connection("inline", "sync")
    )
    again = Connections.from_dict(built.to_dict())
    assert again.to_dict() == built.to_dict()
    manager = QueueManager.from_config(built, registry=registry, container=Container(), environ={})
    assert sorted(manager.connections) == ["inline", "primary"]
    assert rainier_sync.instance() is manager
    assert QueueManager.from_config(again, registry=registry, container=Container(), environ={}).default == "primary"


def test_the_builder_refuses_a_default_nobody_declared_at_boot() -> None:
    with pytest.raises(ConfigurationError, match="default 'primary' names a connection nobody declared"):
        QueueManager.from_config(Connections("primary").with_connection("other", "memory"), environ={})


# -- check_reservations ------------------------------------------------------------------------------------


def test_check_reservations_refuses_a_reservation_shorter_than_the_work() -> None:
    connections = (
        Connections("db")
        .with_connection("db", "memory", reservation=60)
        .with_connection("bulk", "sqs", queue_url=SQS, failed_queue_url=SQS + "-failed", visibility_timeout=300)
        .with_connection("events", "kafka", brokers="127.0.0.1:9092")
    )
    assert connections.check_reservations(59) is connections
    with pytest.raises(ConfigurationError) as caught:
        connections.check_reservations(timedelta(minutes=2))
    message = str(caught.value)
    assert "connection 'db' (memory): reservation is 60s but the longest job takes 120s" in message
    assert "connection 'events' (kafka): lease is 90s (the driver's default)" in message
    assert "'bulk'" not in message


def test_check_reservations_counts_an_equal_reservation_as_too_short() -> None:
    with pytest.raises(ConfigurationError, match="reservation is 90s"):
        Connections().with_connection("m", "memory").check_reservations(90)


def test_check_reservations_ignores_sync_and_refuses_nonsense() -> None:
    connections = Connections().with_connection("inline", "sync")
    connections.check_reservations(10_000)
    with pytest.raises(ConfigurationError, match="longest_job_seconds must be a positive number"):
        connections.check_reservations(-1)


# SqsQueue takes None and documents its default: test_build checks it on moto.
@pytest.mark.parametrize("driver", [name for name in driver_names() if name not in ("sqs", "sync")])
def test_the_default_periods_are_the_drivers_own(driver: str) -> None:
    spec = driver_spec(driver)
    assert spec is not None and spec.period is not None
    key = spec.period
    if driver == "memory":
        factory = MemoryQueue.__init__
    else:
        module = pytest.importorskip(f"rainier_sync.drivers.{driver}")
        cls = getattr(
            module,
            {"database": "DatabaseQueue", "redis": "RedisQueue", "sqs": "SqsQueue", "kafka": "KafkaQueue"}[driver],
        )
        factory = getattr(cls, "from_url", cls.__init__) if driver in ("database", "redis") else cls.__init__
    default = inspect.signature(factory).parameters[key].default
    assert default == spec.default_period
