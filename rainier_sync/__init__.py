"""rainier_sync: a synchronous, threaded job queue.

Jobs are JSON payloads with a stable name; drivers store them with a
reserve-then-acknowledge protocol; a worker runs them on a thread pool.

The names below are the public API. Each loads with the module that defines
it, on first use, so ``import rainier_sync`` costs next to nothing and a web
process that only dispatches never imports the worker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import Connections as Connections
    from .config import QueueResources as QueueResources
    from .container import Container as Container
    from .drivers.base import QueueDriver as QueueDriver
    from .errors import BindingError as BindingError
    from .errors import CapabilityError as CapabilityError
    from .errors import ConfigurationError as ConfigurationError
    from .errors import DatabaseUnavailableError as DatabaseUnavailableError
    from .errors import DriverUnavailableError as DriverUnavailableError
    from .errors import JobCrashedError as JobCrashedError
    from .errors import JobDefinitionError as JobDefinitionError
    from .errors import JobTimeoutError as JobTimeoutError
    from .errors import KafkaQueueError as KafkaQueueError
    from .errors import KafkaUnavailableError as KafkaUnavailableError
    from .errors import NoQueueConfiguredError as NoQueueConfiguredError
    from .errors import PayloadError as PayloadError
    from .errors import QueueUnavailableError as QueueUnavailableError
    from .errors import RainierError as RainierError
    from .errors import RedisUnavailableError as RedisUnavailableError
    from .errors import SchemaMissingError as SchemaMissingError
    from .errors import SqsBatchError as SqsBatchError
    from .errors import SqsUnavailableError as SqsUnavailableError
    from .errors import UniqueLockHeldError as UniqueLockHeldError
    from .errors import UnknownConnectionError as UnknownConnectionError
    from .errors import UnknownJobError as UnknownJobError
    from .errors import UnknownQueueError as UnknownQueueError
    from .jobs import Job as Job
    from .jobs import JobContext as JobContext
    from .manager import QueueManager as QueueManager
    from .manager import dispatch as dispatch
    from .manager import instance as instance
    from .manager import set_instance as set_instance
    from .pending import PendingDispatch as PendingDispatch
    from .registry import JobRegistry as JobRegistry
    from .schedule import Schedule as Schedule
    from .types import ExceptionInfo as ExceptionInfo
    from .types import FailedJob as FailedJob
    from .types import QueueCounts as QueueCounts
    from .types import QueuedJob as QueuedJob
    from .worker import Worker as Worker
    from .worker import WorkerOptions as WorkerOptions
    from .worker import WorkerStats as WorkerStats

__version__ = "0.1.0"

#: Each public name, and the module it lives in.
_WHERE = {
    # Jobs
    "Job": "jobs",
    "JobContext": "jobs",
    "job": "functions",
    "JobRegistry": "registry",
    "Container": "container",
    # Dispatching
    "QueueManager": "manager",
    "PendingDispatch": "pending",
    "dispatch": "manager",
    "instance": "manager",
    "set_instance": "manager",
    # Configuration
    "Connections": "config",
    "QueueResources": "config",
    "QueueDriver": "drivers.base",
    # Working
    "Worker": "worker",
    "WorkerOptions": "worker",
    "Schedule": "schedule",
    "WorkerStats": "worker",
    # Records
    "QueuedJob": "types",
    "FailedJob": "types",
    "ExceptionInfo": "types",
    "QueueCounts": "types",
    # Errors
    **{
        name: "errors"
        for name in (
            "RainierError",
            "BindingError",
            "CapabilityError",
            "ConfigurationError",
            "DatabaseUnavailableError",
            "DriverUnavailableError",
            "JobCrashedError",
            "JobDefinitionError",
            "JobTimeoutError",
            "KafkaQueueError",
            "KafkaUnavailableError",
            "NoQueueConfiguredError",
            "PayloadError",
            "QueueUnavailableError",
            "RedisUnavailableError",
            "SchemaMissingError",
            "SqsBatchError",
            "SqsUnavailableError",
            "UniqueLockHeldError",
            "UnknownConnectionError",
            "UnknownJobError",
            "UnknownQueueError",
        )
    },
}

__all__ = ["__version__", *_WHERE]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rainier_sync' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
