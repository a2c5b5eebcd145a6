"""What configuration knows of the Kafka driver."""

from __future__ import annotations

import re
from typing import Any

from ...errors import ConfigurationError
from ..promises import Promises
from ..spec import OUTBOX, Bad, BootContext, DriverSpec, Kind, Setting, duration, seconds, text

__all__ = ["SPEC", "PROMISES"]


def _check_brokers(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(b, str) for b in items):
        raise Bad(f'must be a list of "host:port" strings, got {value!r}')
    brokers = [b.strip() for b in items if b.strip()]
    if not brokers:
        raise Bad('is empty: list at least one broker, e.g. ["127.0.0.1:9092"]')
    for broker in brokers:
        host, _, port = broker.rpartition(":")
        if not host or not port.isdigit():
            raise Bad(f'must be "host:port" strings, got {broker!r}')
    return brokers


def _check_topic_prefix(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]*", value):
        raise Bad(f"may hold only letters, digits, '.', '_' and '-', got {value!r}")
    return value


def _prepare(where: str, context: BootContext) -> dict[str, Any]:
    if context.locks is None:
        raise ConfigurationError(
            f"{where}: kafka needs a shared lock store for its job leases; give QueueResources(locks=...), "
            "e.g. RedisLockStore.from_url(...) or DatabaseLockStore.from_url(...)"
        )
    return {"locks": context.locks}


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> Any:
    from .queue import KafkaQueue

    return KafkaQueue(**settings, locks=prepared["locks"])


#: What the kafka driver promises about the jobs it accepts.
PROMISES = Promises()

SPEC = DriverSpec(
    promises=PROMISES,
    name="kafka",
    rank=5,
    build=_build,
    prepare=_prepare,
    extra="kafka",
    settings={
        "brokers": Setting(Kind(_check_brokers), env=("KAFKA_BROKERS",), required=""),
        "group": Setting(text(), env=("KAFKA_GROUP",)),
        "topic_prefix": Setting(Kind(_check_topic_prefix), env=("KAFKA_TOPIC_PREFIX",)),
        "lease": Setting(seconds(), env=("QUEUE_RESERVATION",)),
        "timeout": Setting(duration(0.1)),
        "commit_interval": Setting(duration(0.0)),
        "outbox": OUTBOX,
    },
    period="lease",
    default_period=90,
    refusals={"url": ("a kafka connection is given its brokers, not a URL", 'brokers (["host:port", ...])')},
)
