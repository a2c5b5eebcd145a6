"""What each driver takes, what is refused and why: the schema every
declaration is checked against."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping

__all__ = ["DRIVERS", "SETTINGS", "REQUIRED", "ENVIRONMENT", "PERIOD_KEY", "DEFAULT_PERIOD", "ENV_REFUSED", "refusal"]

DRIVERS = ("sync", "memory", "database", "redis", "sqs", "kafka")

# -- the kinds of value a setting takes --------------------------------------------------


class _Bad(Exception):
    """A value does not fit its setting; the message completes "<label> ..."."""


@dataclass(frozen=True)
class _Kind:
    check: Callable[[Any], Any]
    from_text: Callable[[str], Any]


def _int_text(text: str) -> Any:
    try:
        return int(text.strip())
    except ValueError:
        return text  # check() refuses it, quoting what was written


def _whole(minimum: int, maximum: int | None, unit: str) -> Callable[[Any], Any]:
    """Integers of ``unit`` (``""`` for a plain count) from ``minimum`` to ``maximum``."""
    what, of = (f"whole {unit}", f" {unit}") if unit else ("a whole number", "")

    def check(value: Any) -> int:
        if isinstance(value, timedelta) and unit == "seconds":
            value = value.total_seconds()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"must be {what} (an integer), got {value!r}")
        if value < 0:
            raise _Bad(f"must not be negative, got {value}")
        if value < minimum:
            raise _Bad(f"must be at least {minimum}{of}, got {value}")
        if maximum is not None and value > maximum:
            raise _Bad(f"must be at most {maximum}{of}, got {value}")
        return value

    return check


def _seconds(minimum: int = 1, maximum: int | None = None) -> _Kind:
    return _Kind(_whole(minimum, maximum, "seconds"), _int_text)


def _millis() -> _Kind:
    return _Kind(_whole(1, None, "milliseconds"), _int_text)


def _count() -> _Kind:
    return _Kind(_whole(0, None, ""), _int_text)


def _check_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"must be true or false, got {value!r}")
    return value


def _flag_text(text: str) -> Any:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    return words.get(text.strip().lower(), text)


def _text(allow_empty: bool = False) -> _Kind:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _Bad(f"must be a string, got {value!r}")
        if not allow_empty and not value.strip():
            raise _Bad("must not be empty")
        return value

    return _Kind(check, lambda text: text)


def _url(schemes: tuple[str, ...], example: str) -> _Kind:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad(f"must be a URL such as {example}, got {value!r}")
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in schemes:
            starts = " or ".join(s + "://" for s in schemes)
            raise _Bad(f"must be a URL starting {starts} (e.g. {example}), got {value!r}")
        return value

    return _Kind(check, lambda text: text.strip())


_HTTP = _url(("http", "https"), "https://sqs.us-east-1.amazonaws.com/123456789012/jobs")


def _check_url_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _Bad(f"must map queue names to queue URLs, got {value!r}")
    result: dict[str, str] = {}
    for queue, url in value.items():
        if not isinstance(queue, str) or not queue:
            raise _Bad(f"must map queue names to queue URLs; {queue!r} is not a queue name")
        try:
            result[queue] = _HTTP.check(url)
        except _Bad as exc:
            raise _Bad(f"[{queue!r}] {exc}") from None
    return result


def _check_brokers(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(b, str) for b in items):
        raise _Bad(f'must be a list of "host:port" strings, got {value!r}')
    brokers = [b.strip() for b in items if b.strip()]
    if not brokers:
        raise _Bad('is empty: list at least one broker, e.g. ["127.0.0.1:9092"]')
    for broker in brokers:
        host, _, port = broker.rpartition(":")
        if not host or not port.isdigit():
            raise _Bad(f'must be "host:port" strings, got {broker!r}')
    return brokers


def _check_topic_prefix(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]*", value):
        raise _Bad(f"may hold only letters, digits, '.', '_' and '-', got {value!r}")
    return value


_SECONDS = _seconds()
_MS = _millis()

#: The settings each driver takes (besides ``driver``).
SETTINGS: dict[str, dict[str, _Kind]] = {
    "sync": {},
    "memory": {"reservation": _SECONDS},
    "database": {"reservation": _SECONDS},
    "redis": {
        "url": _url(("redis", "rediss", "unix"), "redis://127.0.0.1:6379/1"),
        "prefix": _text(),
        "reservation": _SECONDS,
        "connect_timeout_ms": _MS,
        "response_timeout_ms": _MS,
        "reconnect": _Kind(_check_flag, _flag_text),
        "reconnect_attempts": _count(),
        "reconnect_max_backoff_ms": _MS,
    },
    "sqs": {
        "queue_url": _HTTP,
        "queue_urls": _Kind(_check_url_map, json.loads),
        "region": _text(),
        "endpoint": _url(("http", "https"), "http://127.0.0.1:5000"),
        "visibility_timeout": _seconds(1, 43_200),
        "wait_time": _seconds(0, 20),
        "key": _text(),
        "secret": _text(),
        "failed_queue_url": _HTTP,
    },
    "kafka": {
        "brokers": _Kind(_check_brokers, lambda text: text),
        "group": _text(),
        "topic_prefix": _Kind(_check_topic_prefix, lambda text: text),
        "lease": _SECONDS,
    },
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "redis": ("url",),
    "sqs": ("queue_url", "failed_queue_url"),
    "kafka": ("brokers",),
}

#: With ``QUEUE_DRIVER``, where each setting comes from (the first variable set wins).
ENVIRONMENT: dict[str, dict[str, tuple[str, ...]]] = {
    "sync": {},
    "memory": {"reservation": ("QUEUE_RESERVATION",)},
    "database": {"reservation": ("QUEUE_RESERVATION",)},
    "redis": {"url": ("REDIS_URL",), "prefix": ("REDIS_QUEUE_PREFIX",), "reservation": ("QUEUE_RESERVATION",)},
    "sqs": {
        "queue_url": ("SQS_QUEUE_URL",),
        "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
        "endpoint": ("SQS_ENDPOINT",),
        "key": ("AWS_ACCESS_KEY_ID",),
        "secret": ("AWS_SECRET_ACCESS_KEY",),
        "failed_queue_url": ("SQS_FAILED_QUEUE_URL",),
        "visibility_timeout": ("QUEUE_RESERVATION",),
    },
    "kafka": {
        "brokers": ("KAFKA_BROKERS",),
        "group": ("KAFKA_GROUP",),
        "topic_prefix": ("KAFKA_TOPIC_PREFIX",),
        "lease": ("QUEUE_RESERVATION",),
    },
}

#: The period after which another worker may take a reserved job, per driver.
PERIOD_KEY = {"memory": "reservation", "database": "reservation", "redis": "reservation",
              "sqs": "visibility_timeout", "kafka": "lease"}  # fmt: skip

#: Each driver's default for that period, in seconds, when none is declared.
DEFAULT_PERIOD = {"memory": 90, "database": 90, "redis": 90, "sqs": 30, "kafka": 90}

_EXTRA = {"database": "postgres", "redis": "redis", "sqs": "sqs", "kafka": "kafka"}
_CLASS = {"database": "DatabaseQueue", "redis": "RedisQueue", "sqs": "SqsQueue", "kafka": "KafkaQueue"}

# -- what is refused, why, and what to write instead -------------------------------------

_QUEUE_WHY = (
    "the queue is the job's to name, so a queue on a connection would be a decoy nothing reads",
    "QUEUE on the job class, manager.dispatch_on(queue, job), and queue:work --queue=a,b",
)


def refusal(driver: str, key: str) -> tuple[str, str] | None:
    """Why ``key`` cannot be honoured on a ``driver`` connection and what to write
    instead, or None when it is not a refused declaration."""
    if key == "retry_after":
        period = PERIOD_KEY.get(driver)
        return (
            "it is the reservation under another name",
            f"{period} (whole seconds)" if period else "nothing: sync runs jobs inline and reserves none",
        )
    if key == "after_commit":
        return (
            "a connection cannot see your transaction, so there is no commit for it to wait for",
            "nothing: dispatch after your transaction commits, or on the database driver write the job in it "
            "with manager.pending(job).within(conn).send()",
        )
    if key == "block_for":
        return (
            "no driver blocks in reserve: it returns at once and the worker does the waiting",
            "nothing: the worker's own sleep (queue:work --sleep=N)",
        )
    if key == "table":
        return (
            "the queue's tables are fixed by its migrations, not named per connection",
            "nothing: run the driver's migrations (queue:migrate)",
        )
    if key in ("max_connections", "min_connections", "pool_size"):
        return (
            "no driver here pools connections, and the Redis one multiplexes a single connection",
            "response_timeout_ms and reconnect" if driver == "redis" else "nothing",
        )
    if key == "queue":
        return _QUEUE_WHY
    if key in ("prefix", "suffix") and driver == "sqs":
        return (
            "they compose a queue URL out of parts, and an sqs connection is given the whole URL",
            "queue_url (and queue_urls for other queues)",
        )
    if key == "url" and driver == "sqs":
        return ("an sqs connection is addressed by its queue's URL, not a service URL", "queue_url")
    if key == "url" and driver == "database":
        return (
            "the database driver uses the application's database, not a URL of its own",
            "QueueResources(database=url), or DATABASE_URL in the environment",
        )
    if key == "url" and driver == "kafka":
        return ("a kafka connection is given its brokers, not a URL", 'brokers (["host:port", ...])')
    if key == "connection":
        if driver == "redis":
            return (
                "it would point the queue at another client's Redis database (the cache's), "
                "the sharing that makes a queue lose jobs to eviction and flushes",
                "url, with a database index of its own (redis://127.0.0.1:6379/1)",
            )
        if driver == "database":
            return (
                "the database driver uses the application's database, not a named connection",
                "QueueResources(database=url), or DATABASE_URL in the environment",
            )
        return ("each connection is built from its own declaration and shares no client", "this driver's own settings")
    return None


#: Variables another framework reads for its queue; with QUEUE_DRIVER set, each is refused.
ENV_REFUSED: dict[str, tuple[str | None, str, str]] = {
    "QUEUE_CONNECTION": (None, "it is another framework's name for the driver", "QUEUE_DRIVER"),
    "QUEUE_RESERVATION": ("sync", "sync runs jobs inline and reserves none", "nothing"),
    "SQS_PREFIX": ("sqs", "it composes a queue URL out of parts", "SQS_QUEUE_URL (the whole URL)"),
    "SQS_SUFFIX": ("sqs", "it composes a queue URL out of parts", "SQS_QUEUE_URL (the whole URL)"),
    "SQS_QUEUE": ("sqs", *_QUEUE_WHY),
    "REDIS_QUEUE": ("redis", *_QUEUE_WHY),
    "REDIS_QUEUE_CONNECTION": ("redis", "it would share another client's Redis database", "REDIS_URL"),
    "REDIS_QUEUE_RETRY_AFTER": ("redis", "it is the reservation under another name", "QUEUE_RESERVATION"),
    "DB_QUEUE": ("database", *_QUEUE_WHY),
    "DB_QUEUE_TABLE": ("database", "the queue's tables are fixed by its migrations", "nothing: run queue:migrate"),
    "DB_QUEUE_RETRY_AFTER": ("database", "it is the reservation under another name", "QUEUE_RESERVATION"),
    "DB_QUEUE_CONNECTION": ("database", "the database comes from DATABASE_URL", "DATABASE_URL"),
}


def _suggest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
