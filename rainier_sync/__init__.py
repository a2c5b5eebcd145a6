"""rainier_sync: a synchronous, threaded job queue.

Jobs are JSON payloads with a stable name; drivers store them with a
reserve-then-acknowledge protocol; a worker runs them on a thread pool.
"""

from __future__ import annotations

from .config import Connections, QueueResources
from .container import Container
from .drivers.base import QueueDriver
from .errors import (
    BindingError,
    ConfigurationError,
    JobDefinitionError,
    NoQueueConfiguredError,
    PayloadError,
    RainierError,
    UnknownConnectionError,
    UnknownJobError,
)
from .job import Job, JobContext
from .manager import PendingDispatch, QueueManager, dispatch, instance, set_instance
from .registry import JobRegistry
from .types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob
from .worker import Worker, WorkerOptions, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "BindingError",
    "ConfigurationError",
    "Connections",
    "Container",
    "ExceptionInfo",
    "FailedJob",
    "Job",
    "JobContext",
    "JobDefinitionError",
    "JobRegistry",
    "NoQueueConfiguredError",
    "PayloadError",
    "PendingDispatch",
    "QueueCounts",
    "QueueDriver",
    "QueueManager",
    "QueueResources",
    "QueuedJob",
    "RainierError",
    "UnknownConnectionError",
    "UnknownJobError",
    "Worker",
    "WorkerOptions",
    "WorkerStats",
    "dispatch",
    "instance",
    "set_instance",
]
