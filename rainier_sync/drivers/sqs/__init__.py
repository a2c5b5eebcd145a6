"""The SQS driver: jobs as messages on Amazon SQS queues, failed jobs on a queue of their own.

The classes load on first use, so importing this package (for its ``spec``)
needs none of the driver's optional dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .queue import SqsBatchError, SqsQueue, SqsUnavailableError, UnknownQueueError

__all__ = ["SqsBatchError", "SqsQueue", "SqsUnavailableError", "UnknownQueueError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.queue"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
