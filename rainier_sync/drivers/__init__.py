"""Queue drivers. Memory and sync load eagerly; the others load on first use,
so ``import rainier_sync`` needs none of their optional dependencies."""

from __future__ import annotations

import importlib
from typing import Any

from .base import BaseQueue, QueueDriver, Waker
from .memory import MemoryQueue
from .sync import SyncQueue

__all__ = [
    "BaseQueue",
    "QueueDriver",
    "Waker",
    "MemoryQueue",
    "SyncQueue",
    "DatabaseQueue",
    "RedisQueue",
    "SqsQueue",
    "KafkaQueue",
]

_LAZY = {
    "DatabaseQueue": "rainier_sync.drivers.database",
    "RedisQueue": "rainier_sync.drivers.redis",
    "SqsQueue": "rainier_sync.drivers.sqs",
    "KafkaQueue": "rainier_sync.drivers.kafka",
}

#: The extra that installs each optional driver's dependency.
EXTRAS = {"database": "postgres", "redis": "redis", "sqs": "sqs", "kafka": "kafka"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rainier_sync.drivers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
