"""What configuration knows of the Redis driver."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from ..promises import Promises
from ..spec import (
    OUTBOX,
    QUEUE_DECOY,
    Bad,
    Declared,
    DriverSpec,
    Kind,
    Setting,
    count,
    flag,
    millis,
    seconds,
    text,
    url,
)

__all__ = ["SPEC", "PROMISES"]

_POOLS = (
    "no driver here pools connections, and the Redis one multiplexes a single connection",
    "response_timeout_ms and reconnect",
)


def _host_list(value: Any) -> list[str]:
    """``sentinels``: ``host:port`` strings, as a list or comma-separated."""
    entries = value.split(",") if isinstance(value, str) else value
    if not isinstance(entries, (list, tuple)) or not entries:
        raise Bad(f"must be a list of host:port (e.g. [\"10.0.0.1:26379\", \"10.0.0.2:26379\"]), got {value!r}")
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip() or entry.strip().startswith(":") or " " in entry.strip():
            raise Bad(f"must be a list of host:port, and {entry!r} is not one")
        host, colon, port = entry.strip().rpartition(":")
        if colon and not (port.isdigit() and 0 < int(port) < 65536) and not entry.strip().endswith("]"):
            raise Bad(f"must be a list of host:port, and {entry!r} has no valid port (1 to 65535)")
    return [entry.strip() for entry in entries]


def _service(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "/" in value:
        raise Bad(f"must name the service the sentinels watch (as in SENTINEL MONITOR), got {value!r}")
    return value.strip()


def _check(declared: Declared) -> None:
    settings, label = declared.settings, declared.label
    _check_target(declared)
    if settings.get("reconnect") is not True:
        for key in ("reconnect_attempts", "reconnect_max_backoff_ms"):
            if key in settings:
                raise ConfigurationError(
                    f"{declared.where(key)}: {label(key)} does nothing without {label('reconnect')} = true; "
                    f"write {label('reconnect')} = true too, or remove it"
                )


def _check_target(declared: Declared) -> None:
    """``url``, or ``sentinels`` with ``service_name``: what contradicts is refused by name."""
    settings, label, where = declared.settings, declared.label, declared.where
    given = settings.get("url")
    sentinel_url = isinstance(given, str) and given.lower().startswith(("redis+sentinel://", "redis+cluster://"))
    if "sentinels" in settings or "service_name" in settings:
        key = "sentinels" if "sentinels" in settings else "service_name"
        other = "service_name" if key == "sentinels" else "sentinels"
        if other not in settings:
            raise ConfigurationError(f"{where(key)}: {label(key)} is given without {label(other)}; write both")
        if sentinel_url:
            raise ConfigurationError(
                f"{where('url')}: {label('url')} {given!r} contradicts {label('sentinels')}: name the servers once, "
                f"in {label('url')} or in {label('sentinels')} and {label('service_name')}"
            )
    elif given is None:
        raise ConfigurationError(
            f"{where('url')}: {label('url')} is required and not set (or give {label('sentinels')} "
            f"and {label('service_name')})"
        )
    from .targets import _target  # the URL's own checks: no client library, no connection

    owner = where("url" if given is not None else "sentinels")
    _target(owner, given, settings.get("sentinels"), settings.get("service_name"))


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> Any:
    from .queue import RedisQueue

    settings = dict(settings)
    return RedisQueue.from_url(settings.pop("url", None), **settings)


#: What the redis driver promises about the jobs it accepts.
PROMISES = Promises(may_lose_an_accepted_job=True)

SPEC = DriverSpec(
    promises=PROMISES,
    name="redis",
    rank=3,
    build=_build,
    check=_check,
    extra="redis",
    settings={
        "url": Setting(
            url(("redis", "rediss", "unix", "redis+sentinel", "redis+cluster"), "redis://127.0.0.1:6379/1"),
            env=("REDIS_URL",),
        ),
        "sentinels": Setting(Kind(_host_list), env=("REDIS_SENTINELS",)),
        "service_name": Setting(Kind(_service), env=("REDIS_SENTINEL_SERVICE",)),
        "prefix": Setting(text(), env=("REDIS_QUEUE_PREFIX",)),
        "reservation": Setting(seconds(), env=("QUEUE_RESERVATION",)),
        "outbox": OUTBOX,
        "connect_timeout_ms": Setting(millis(), env=("REDIS_CONNECT_TIMEOUT_MS",)),
        "response_timeout_ms": Setting(millis(), env=("REDIS_RESPONSE_TIMEOUT_MS",)),
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
