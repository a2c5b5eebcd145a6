"""What configuration knows of the Redis driver."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from ..spec import OUTBOX, QUEUE_DECOY, Declared, DriverSpec, Setting, count, flag, millis, seconds, text, url

__all__ = ["SPEC"]

_POOLS = (
    "no driver here pools connections, and the Redis one multiplexes a single connection",
    "response_timeout_ms and reconnect",
)


def _check(declared: Declared) -> None:
    settings, label = declared.settings, declared.label
    if settings.get("reconnect") is not True:
        for key in ("reconnect_attempts", "reconnect_max_backoff_ms"):
            if key in settings:
                raise ConfigurationError(
                    f"{declared.where(key)}: {label(key)} does nothing without {label('reconnect')} = true; "
                    f"write {label('reconnect')} = true too, or remove it"
                )


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> Any:
    from .queue import RedisQueue

    settings = dict(settings)
    return RedisQueue.from_url(settings.pop("url"), **settings)


SPEC = DriverSpec(
    name="redis",
    rank=3,
    build=_build,
    check=_check,
    extra="redis",
    settings={
        "url": Setting(url(("redis", "rediss", "unix"), "redis://127.0.0.1:6379/1"), env=("REDIS_URL",), required=""),
        "prefix": Setting(text(), env=("REDIS_QUEUE_PREFIX",)),
        "reservation": Setting(seconds(), env=("QUEUE_RESERVATION",)),
        "outbox": OUTBOX,
        "connect_timeout_ms": Setting(millis()),
        "response_timeout_ms": Setting(millis()),
        "reconnect": Setting(flag()),
        "reconnect_attempts": Setting(count()),
        "reconnect_max_backoff_ms": Setting(millis()),
    },
    period="reservation",
    default_period=90,
    refusals={
        "connection": (
            "it would point the queue at another client's Redis database (the cache's), "
            "the sharing that makes a queue lose jobs to eviction and flushes",
            "url, with a database index of its own (redis://127.0.0.1:6379/1)",
        ),
        "max_connections": _POOLS,
        "min_connections": _POOLS,
        "pool_size": _POOLS,
    },
    env_refused={
        "REDIS_QUEUE": QUEUE_DECOY,
        "REDIS_QUEUE_CONNECTION": ("it would share another client's Redis database", "REDIS_URL"),
        "REDIS_QUEUE_RETRY_AFTER": ("it is the reservation under another name", "QUEUE_RESERVATION"),
    },
)
