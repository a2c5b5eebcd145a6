"""The process-wide manager: the one :func:`instance` returns, set by
:func:`set_instance` or by booting, and what an integration (Flask's current
app) answers first."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from .errors import NoQueueConfiguredError

if TYPE_CHECKING:
    from .job import Job
    from .manager import QueueManager

__all__ = ["instance", "instance_or_none", "set_instance", "add_instance_resolver", "dispatch"]

_instance: QueueManager | None = None
_instance_lock = threading.Lock()
_resolvers: list[Callable[[], QueueManager | None]] = []


def add_instance_resolver(resolver: Callable[[], QueueManager | None]) -> None:
    """Let an integration (Flask's current app, say) answer :func:`instance`
    first; a resolver returns None when it has no manager to offer."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def instance() -> QueueManager:
    """The process-wide manager (set by :func:`set_instance` or by booting)."""
    for resolver in _resolvers:
        found = resolver()
        if found is not None:
            return found
    manager = _instance
    if manager is None:
        raise NoQueueConfiguredError(
            "no QueueManager is set for this process: call rainier_sync.set_instance(manager) at boot"
        )
    return manager


def instance_or_none() -> QueueManager | None:
    """The manager :func:`set_instance` set for this process, or None."""
    return _instance


def set_instance(manager: QueueManager | None) -> QueueManager | None:
    """Make ``manager`` the process-wide manager; returns the previous one."""
    global _instance
    with _instance_lock:
        previous, _instance = _instance, manager
    return previous


def dispatch(job: Job) -> str | None:
    """``instance().dispatch(job)``."""
    return instance().dispatch(job)
