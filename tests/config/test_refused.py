"""Every setting this framework cannot honour, and every decoy, is refused by
name with what to write instead; so is every key nobody knows."""

from __future__ import annotations

from typing import Any

import pytest

from rainier_sync import ConfigurationError, QueueManager
from rainier_sync.config import Connections

SQS_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"

#: A valid declaration of each driver, to add one bad key to.
BASE: dict[str, dict[str, Any]] = {
    "sync": {"driver": "sync"},
    "memory": {"driver": "memory"},
    "database": {"driver": "database"},
    "redis": {"driver": "redis", "url": "redis://127.0.0.1:6379/1"},
    "sqs": {"driver": "sqs", "queue_url": SQS_URL, "failed_queue_url": SQS_URL + "-failed"},
    "kafka": {"driver": "kafka", "brokers": ["127.0.0.1:9092"]},
}


def refused(declaration: dict[str, Any]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        Connections.from_dict({"default": "primary", "connections": {"primary": declaration}})
    return str(caught.value)


# (driver, key, value, what the message must name as the replacement)
CANNOT_HONOUR = [
    ("database", "retry_after", 90, "reservation"),
    ("redis", "retry_after", 90, "reservation"),
    ("memory", "retry_after", 90, "reservation"),
    ("sqs", "retry_after", 90, "visibility_timeout"),
    ("kafka", "retry_after", 90, "lease"),
    ("sync", "retry_after", 90, "nothing"),
    ("database", "after_commit", True, "within(conn)"),
    ("redis", "after_commit", True, "dispatch after your transaction commits"),
    ("redis", "block_for", 5, "--sleep"),
    ("database", "block_for", 5, "--sleep"),
    ("database", "table", "jobs", "queue:migrate"),
    ("redis", "table", "jobs", "queue:migrate"),
    ("sqs", "prefix", "https://sqs.us-east-1.amazonaws.com/1234", "queue_url"),
    ("sqs", "suffix", "-production", "queue_url"),
    ("redis", "connection", "default", "url, with a database index of its own"),
    ("database", "connection", "pgsql", "DATABASE_URL"),
    ("redis", "max_connections", 10, "response_timeout_ms and reconnect"),
    ("redis", "min_connections", 1, "response_timeout_ms and reconnect"),
    ("redis", "pool_size", 10, "response_timeout_ms and reconnect"),
    ("database", "pool_size", 10, "nothing"),
]


@pytest.mark.parametrize(("driver", "key", "value", "instead"), CANNOT_HONOUR)
def test_a_setting_this_framework_cannot_honour_is_refused_by_name(
    driver: str, key: str, value: Any, instead: str
) -> None:
    message = refused({**BASE[driver], key: value})
    assert f"{key!r} cannot be honoured" in message
    assert f"Write instead: {instead}" in message or instead in message.split("Write instead:")[1]
    assert "connection 'primary'" in message


@pytest.mark.parametrize("driver", sorted(BASE))
def test_a_queue_on_any_connection_is_a_decoy(driver: str) -> None:
    message = refused({**BASE[driver], "queue": "emails"})
    assert "'queue' cannot be honoured" in message
    assert "QUEUE on the job class" in message and "--queue" in message


def test_a_connection_without_a_driver_is_refused() -> None:
    message = refused({"url": "redis://127.0.0.1:6379/1"})
    assert "has no driver" in message and "sync, memory, database, redis, sqs, kafka" in message


def test_an_unknown_driver_is_refused_with_the_nearest_one() -> None:
    message = refused({"driver": "reddis", "url": "redis://127.0.0.1:6379/1"})
    assert "driver 'reddis' is not one of" in message and "did you mean 'redis'?" in message


@pytest.mark.parametrize(
    ("driver", "instead"), [("sqs", "queue_url"), ("database", "DATABASE_URL"), ("kafka", "brokers")]
)
def test_a_url_where_the_driver_takes_something_else_is_refused(driver: str, instead: str) -> None:
    message = refused({**BASE[driver], "url": "https://example.com/"})
    assert "'url' cannot be honoured" in message and instead in message


def test_an_sqs_key_without_its_secret_is_refused() -> None:
    message = refused({**BASE["sqs"], "region": "us-east-1", "key": "AKIA"})
    assert "key without secret" in message and "write secret too" in message


def test_an_sqs_secret_without_its_key_is_refused() -> None:
    message = refused({**BASE["sqs"], "region": "us-east-1", "secret": "s3cret"})
    assert "secret without key" in message and "write key too" in message


def test_sqs_credentials_without_a_region_are_refused() -> None:
    message = refused({**BASE["sqs"], "key": "AKIA", "secret": "s3cret"})
    assert "key and secret without region" in message and "write region" in message


def test_sqs_without_a_failed_queue_is_refused_saying_why() -> None:
    message = refused({"driver": "sqs", "queue_url": SQS_URL})
    assert "failed_queue_url is required and not set" in message and "it would be lost" in message


def test_two_sqs_queues_sharing_one_url_are_refused() -> None:
    message = refused({**BASE["sqs"], "queue_urls": {"mail": SQS_URL + "-mail", "bulk": SQS_URL + "-mail"}})
    assert "queues 'mail' and 'bulk' share one URL" in message


def test_an_sqs_failed_queue_that_is_also_a_job_queue_is_refused() -> None:
    message = refused({**BASE["sqs"], "failed_queue_url": SQS_URL})
    assert "failed_queue_url is also queue 'default''s URL" in message


@pytest.mark.parametrize("brokers", [[], "", " , ", [" "]])
def test_empty_kafka_brokers_are_refused(brokers: Any) -> None:
    message = refused({"driver": "kafka", "brokers": brokers})
    assert "brokers is empty" in message


def test_kafka_without_brokers_is_refused() -> None:
    assert "brokers is required" in refused({"driver": "kafka"})


def test_a_default_naming_a_connection_nobody_declared_is_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Connections.from_dict({"default": "primray", "connections": {"primary": {"driver": "memory"}}})
    message = str(caught.value)
    assert "default 'primray' names a connection nobody declared" in message
    assert "did you mean 'primary'?" in message


def test_two_connections_and_no_default_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="no default names one of them; write default"):
        Connections.from_dict({"connections": {"a": {"driver": "memory"}, "b": {"driver": "memory"}}})


@pytest.mark.parametrize(
    ("driver", "key", "suggested"),
    [
        ("redis", "reservaton", "reservation"),
        ("redis", "respone_timeout_ms", "response_timeout_ms"),
        ("sqs", "visibility", "visibility_timeout"),
        ("sqs", "queue_urll", "queue_url"),
        ("kafka", "topicprefix", "topic_prefix"),
        ("kafka", "leases", "lease"),
        ("memory", "reservations", "reservation"),
    ],
)
def test_an_unknown_key_is_refused_with_the_nearest_known_one(driver: str, key: str, suggested: str) -> None:
    message = refused({**BASE[driver], key: 1})
    assert f"unknown setting {key!r}" in message and f"did you mean {suggested!r}?" in message


def test_an_unknown_key_far_from_any_says_what_the_driver_takes() -> None:
    message = refused({**BASE["database"], "colour": "blue"})
    assert "unknown setting 'colour'" in message
    assert "database takes: listen, reconnect_for, reservation, response_timeout" in message


def test_sync_takes_no_settings() -> None:
    assert "sync takes: no settings" in refused({"driver": "sync", "reservation": 90})


def test_a_setting_of_another_driver_is_unknown_here() -> None:
    # Each connection is built from its own declaration: redis's prefix means nothing to kafka.
    message = refused({**BASE["kafka"], "prefix": "jobs."})
    assert "unknown setting 'prefix'" in message


def test_an_unknown_key_in_the_section_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown key 'conections'.*did you mean 'connections'\?"):
        Connections.from_dict({"conections": {}})


def test_a_failed_section_is_refused_saying_drivers_keep_their_own() -> None:
    with pytest.raises(ConfigurationError, match="kept by each connection's own driver"):
        Connections.from_dict({"failed": {"driver": "database"}, "connections": {}})


# -- types, units and signs ------------------------------------------------------------------------

BAD_VALUES = [
    ("redis", "reservation", -5, "must not be negative"),
    ("redis", "reservation", 0, "at least 1"),
    ("redis", "reservation", 1.5, "whole seconds"),
    ("redis", "reservation", "90", "whole seconds"),
    ("redis", "reservation", "90s", "whole seconds"),
    ("redis", "reservation", True, "whole seconds"),
    ("database", "reservation", -1, "must not be negative"),
    ("memory", "reservation", None, "whole seconds"),
    ("redis", "connect_timeout_ms", -1, "must not be negative"),
    ("redis", "connect_timeout_ms", 2.5, "whole milliseconds"),
    ("redis", "response_timeout_ms", "250ms", "whole milliseconds"),
    ("redis", "reconnect", "yes", "true or false"),
    ("redis", "reconnect", 1, "true or false"),
    ("redis", "reconnect_attempts", 1.5, "must be a whole number (an integer)"),
    ("redis", "reconnect_attempts", -1, "must not be negative"),
    ("redis", "prefix", "", "must not be empty"),
    ("redis", "url", "http://127.0.0.1:6379", "redis://"),
    ("sqs", "visibility_timeout", -30, "must not be negative"),
    ("sqs", "visibility_timeout", 50_000, "at most 43200"),
    ("sqs", "wait_time", 25, "at most 20"),
    ("sqs", "queue_url", "jobs", "https://"),
    ("sqs", "endpoint", "127.0.0.1:5000", "http://"),
    ("sqs", "queue_urls", ["https://x/y"], "must map queue names"),
    ("sqs", "queue_urls", {"mail": "mail"}, "['mail']"),
    ("sqs", "region", 7, "must be a string"),
    ("kafka", "lease", -90, "must not be negative"),
    ("kafka", "brokers", ["127.0.0.1"], "host:port"),
    ("kafka", "brokers", 9092, "host:port"),
    ("kafka", "topic_prefix", "jobs/", "letters, digits"),
]


@pytest.mark.parametrize(("driver", "key", "value", "says"), BAD_VALUES)
def test_a_wrong_type_unit_or_sign_is_refused_naming_the_key(driver: str, key: str, value: Any, says: str) -> None:
    message = refused({**BASE[driver], key: value})
    assert f"({driver}): {key} " in message
    assert says in message


def test_reconnect_options_without_reconnect_are_refused() -> None:
    message = refused({**BASE["redis"], "reconnect_attempts": 5})
    assert "reconnect_attempts does nothing without reconnect = true" in message


def test_every_connection_is_checked_before_any_is_opened() -> None:
    # Connection "a" would try a server that is not there; "b"'s missing lock
    # store must be reported first, without trying.
    section = {
        "default": "a",
        "connections": {"a": {"driver": "database"}, "b": {"driver": "kafka", "brokers": "127.0.0.1:1"}},
    }
    with pytest.raises(ConfigurationError, match=r"connection 'b' \(kafka\).*QueueResources\(locks=\.\.\.\)"):
        QueueManager.from_config(section, environ={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
