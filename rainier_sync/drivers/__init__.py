"""Queue drivers, one module or package each. Every driver loads on first use,
so ``import rainier_sync`` needs none of their optional dependencies; a driver
whose client library is missing raises ``DriverUnavailableError`` naming the
extra to install."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import BaseQueue, QueueDriver, Waker

if TYPE_CHECKING:
    from .database import DatabaseQueue as DatabaseQueue
    from .kafka import KafkaQueue as KafkaQueue
    from .memory import MemoryQueue as MemoryQueue
    from .redis import RedisQueue as RedisQueue
    from .sqs import SqsQueue as SqsQueue
    from .sync import SyncQueue as SyncQueue

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
    "MemoryQueue": "memory",
    "SyncQueue": "sync",
    "DatabaseQueue": "database",
    "RedisQueue": "redis",
    "SqsQueue": "sqs",
    "KafkaQueue": "kafka",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rainier_sync.drivers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
