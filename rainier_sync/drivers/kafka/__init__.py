"""The Kafka driver: jobs as records on topics, leases in a shared lock store.

The classes load on first use, so importing this package (for its ``spec``)
needs none of the driver's optional dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .queue import KafkaQueue, KafkaQueueError, KafkaUnavailableError

__all__ = ["KafkaQueue", "KafkaQueueError", "KafkaUnavailableError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.queue"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
