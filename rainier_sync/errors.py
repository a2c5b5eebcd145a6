"""Exceptions raised by rainier_sync."""

from __future__ import annotations

__all__ = [
    "RainierError",
    "JobDefinitionError",
    "PayloadError",
    "UnknownJobError",
    "UnknownConnectionError",
    "ConfigurationError",
    "BindingError",
    "NoQueueConfiguredError",
    "DriverUnavailableError",
    "JobTimeoutError",
    "JobCrashedError",
    "QueueUnavailableError",
    "UniqueLockHeldError",
]


class RainierError(Exception):
    """Base class of every error the library raises on purpose."""


class JobDefinitionError(RainierError, TypeError):
    """A job class cannot be registered (no ``NAME``, a duplicate ``NAME``, ...)."""


class PayloadError(RainierError, ValueError):
    """A job's payload cannot cross the wire (not JSON, or not this job's shape)."""


class UnknownJobError(RainierError, LookupError):
    """No job class is registered under a name met on the wire."""


class UnknownConnectionError(RainierError, LookupError):
    """A connection name nobody declared."""


class ConfigurationError(RainierError, ValueError):
    """The queue configuration is wrong; raised at boot."""


class BindingError(RainierError, LookupError):
    """The container has no binding for a key."""


class NoQueueConfiguredError(RainierError):
    """Nothing configured a queue, so there is nowhere to dispatch."""


class DriverUnavailableError(RainierError, ImportError):
    """A driver's optional dependency is not installed."""


class JobTimeoutError(RainierError):
    """An attempt overran its time limit and was killed."""


class JobCrashedError(RainierError):
    """The process running an attempt died (signal, ``os._exit``, OOM kill)."""


class QueueUnavailableError(RainierError):
    """The backend kept failing (a ``once`` worker gives up rather than hang)."""


class UniqueLockHeldError(RainierError):
    """A failed unique job cannot be retried: a live copy of it holds its lock."""
