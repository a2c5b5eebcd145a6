"""``QUEUE_DRIVER`` declares one connection named after its driver, with its
settings from the variables beside it; a missing one fails the boot naming it."""

from __future__ import annotations

import pytest

from rainier_sync import ConfigurationError, Connections, JobRegistry, QueueManager
from rainier_sync.drivers import MemoryQueue, SyncQueue

SQS = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"


def boot_error(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        QueueManager.from_env(registry=JobRegistry(), environ=environ)
    return str(caught.value)


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"QUEUE_DRIVER": "database"}, "DATABASE_URL"),
        ({"QUEUE_DRIVER": "redis"}, "REDIS_URL"),
        ({"QUEUE_DRIVER": "sqs", "SQS_FAILED_QUEUE_URL": SQS + "-failed"}, "SQS_QUEUE_URL"),
        ({"QUEUE_DRIVER": "sqs", "SQS_QUEUE_URL": SQS}, "SQS_FAILED_QUEUE_URL"),
        ({"QUEUE_DRIVER": "kafka"}, "KAFKA_BROKERS"),
    ],
)
def test_a_missing_setting_fails_the_boot_naming_the_variable(environ: dict[str, str], variable: str) -> None:
    message = boot_error(environ)
    assert message.startswith(f"QUEUE_DRIVER={environ['QUEUE_DRIVER']}: ")
    assert f"{variable} is " in message and "not set" in message


def test_queue_driver_builds_one_connection_named_after_its_driver() -> None:
    manager = QueueManager.from_env(environ={"QUEUE_DRIVER": "Memory", "QUEUE_RESERVATION": "120"})
    assert list(manager.connections) == ["memory"] and manager.default == "memory"
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue) and driver.reservation == 120


def test_sync_from_the_environment_takes_the_registry_and_container_given() -> None:
    from rainier_sync import Container

    manager = QueueManager.from_env(JobRegistry(), Container(), environ={"QUEUE_DRIVER": "sync"})
    assert isinstance(manager.connection("sync"), SyncQueue)


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_queue_driver_is_unset(value: str) -> None:
    assert QueueManager.from_env(environ={"QUEUE_DRIVER": value}).connections == {}


def test_an_unknown_queue_driver_is_refused_with_the_nearest_one() -> None:
    message = boot_error({"QUEUE_DRIVER": "sqlite"})
    assert "QUEUE_DRIVER=sqlite is not one of sync, memory, database, redis, sqs, kafka" in message


def test_a_misspelt_queue_driver_gets_a_suggestion() -> None:
    assert "did you mean 'database'?" in boot_error({"QUEUE_DRIVER": "databse"})


def test_a_wrong_value_names_the_variable() -> None:
    message = boot_error({"QUEUE_DRIVER": "memory", "QUEUE_RESERVATION": "-5"})
    assert message == "QUEUE_DRIVER=memory: QUEUE_RESERVATION must not be negative, got -5"


def test_a_wrong_url_names_the_variable() -> None:
    message = boot_error({"QUEUE_DRIVER": "redis", "REDIS_URL": "127.0.0.1:6379"})
    assert message.startswith("QUEUE_DRIVER=redis: REDIS_URL must be a URL starting redis://")


def test_half_a_credential_names_both_variables() -> None:
    message = boot_error(
        {"QUEUE_DRIVER": "sqs", "SQS_QUEUE_URL": SQS, "SQS_FAILED_QUEUE_URL": SQS + "-f", "AWS_ACCESS_KEY_ID": "AK"}
    )
    assert "AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY" in message


def test_credentials_without_a_region_name_the_region_variables() -> None:
    message = boot_error(
        {
            "QUEUE_DRIVER": "sqs",
            "SQS_QUEUE_URL": SQS,
            "SQS_FAILED_QUEUE_URL": SQS + "-f",
            "AWS_ACCESS_KEY_ID": "AK",
            "AWS_SECRET_ACCESS_KEY": "s",
        }
    )
    assert "without AWS_REGION or AWS_DEFAULT_REGION" in message and "write AWS_REGION or AWS_DEFAULT_REGION" in message


def test_aws_region_is_preferred_to_aws_default_region() -> None:
    connections = Connections.from_env(
        {
            "QUEUE_DRIVER": "sqs",
            "SQS_QUEUE_URL": SQS,
            "SQS_FAILED_QUEUE_URL": SQS + "-f",
            "AWS_REGION": "eu-west-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    assert connections["sqs"].settings["region"] == "eu-west-1"


def test_kafka_brokers_are_a_comma_separated_list() -> None:
    connections = Connections.from_env({"QUEUE_DRIVER": "kafka", "KAFKA_BROKERS": "a:9092, b:9093"})
    assert connections["kafka"].settings["brokers"] == ["a:9092", "b:9093"]


def test_queue_connection_is_refused_for_queue_driver() -> None:
    message = boot_error({"QUEUE_CONNECTION": "redis"})
    assert "QUEUE_CONNECTION=redis is not read" in message and "write QUEUE_DRIVER instead" in message


@pytest.mark.parametrize(
    ("driver", "variable", "instead"),
    [
        ("sqs", "SQS_PREFIX", "SQS_QUEUE_URL"),
        ("sqs", "SQS_SUFFIX", "SQS_QUEUE_URL"),
        ("sqs", "SQS_QUEUE", "QUEUE on the job class"),
        ("redis", "REDIS_QUEUE", "QUEUE on the job class"),
        ("redis", "REDIS_QUEUE_CONNECTION", "REDIS_URL"),
        ("redis", "REDIS_QUEUE_RETRY_AFTER", "QUEUE_RESERVATION"),
        ("database", "DB_QUEUE_TABLE", "queue:migrate"),
        ("database", "DB_QUEUE_RETRY_AFTER", "QUEUE_RESERVATION"),
        ("database", "DB_QUEUE_CONNECTION", "DATABASE_URL"),
        ("database", "DB_QUEUE", "QUEUE on the job class"),
    ],
)
def test_another_frameworks_queue_variables_are_refused(driver: str, variable: str, instead: str) -> None:
    message = boot_error({"QUEUE_DRIVER": driver, variable: "x"})
    assert f"{variable} cannot be honoured" in message and instead in message


def test_another_drivers_variables_are_left_alone() -> None:
    # SQS_PREFIX means nothing to a memory connection, and may be the application's own.
    assert QueueManager.from_env(environ={"QUEUE_DRIVER": "memory", "SQS_PREFIX": "x"}).default == "memory"


@pytest.mark.parametrize(("driver", "key"), [("sqs", "visibility_timeout"), ("kafka", "lease")])
def test_queue_reservation_is_each_drivers_own_period(driver: str, key: str) -> None:
    environ = {"QUEUE_DRIVER": driver, "QUEUE_RESERVATION": "300", "KAFKA_BROKERS": "a:9092",
               "SQS_QUEUE_URL": SQS, "SQS_FAILED_QUEUE_URL": SQS + "-f"}  # fmt: skip
    connection = Connections.from_env(environ)[driver]
    assert connection.settings[key] == 300 and connection.label(key) == "QUEUE_RESERVATION"
    with pytest.raises(ConfigurationError, match="QUEUE_RESERVATION is 300s but the longest job takes 400s"):
        Connections.from_env(environ).check_reservations(400)


def test_queue_reservation_is_refused_for_sync() -> None:
    assert "QUEUE_RESERVATION cannot be honoured: sync runs jobs inline" in boot_error(
        {"QUEUE_DRIVER": "sync", "QUEUE_RESERVATION": "90"}
    )


def test_unset_builds_no_queue_and_dispatch_says_so() -> None:
    import rainier_sync
    from rainier_sync import NoQueueConfiguredError

    from .conftest import Ping

    manager = QueueManager.from_env(environ={})
    assert manager.connections == {} and rainier_sync.instance() is manager
    with pytest.raises(NoQueueConfiguredError, match="no queue is configured"):
        rainier_sync.dispatch(Ping())


def test_sqs_timeout_comes_from_its_variable_and_a_bad_one_names_it() -> None:
    environ = {"QUEUE_DRIVER": "sqs", "SQS_QUEUE_URL": SQS, "SQS_FAILED_QUEUE_URL": SQS + "-f"}
    environ["AWS_REGION"] = "us-east-1"
    manager = QueueManager.from_env(environ={**environ, "SQS_TIMEOUT": "12"})
    try:
        assert manager.connection().timeout == 12
    finally:
        manager.close()
    assert "SQS_TIMEOUT" in boot_error({**environ, "SQS_TIMEOUT": "0"})
