"""The Redis driver: jobs in streams with consumer groups, delayed jobs in a sorted set.

The classes load on first use, so importing this package (for its ``spec``)
needs none of the driver's optional dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .queue import RedisQueue, RedisUnavailableError
    from .store import RedisLockStore

__all__ = ["RedisLockStore", "RedisQueue", "RedisUnavailableError"]


def __getattr__(name: str) -> Any:
    if name == "RedisLockStore":
        return getattr(importlib.import_module(f"{__name__}.store"), name)
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.queue"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
