"""Configuration and boot: ``QUEUE_DRIVER`` or a ``queues`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .container import Container
    from .locks.base import LockStore
    from .manager import QueueManager
    from .registry import JobRegistry

__all__ = ["QueueResources", "boot_from_env", "boot_from_config"]


@dataclass
class QueueResources:
    """What a configuration file cannot hold: the registry and container (sync
    runs jobs inline), the application's database (database driver) and a
    shared lock store (kafka, and unique jobs)."""

    registry: JobRegistry | None = None
    container: Container | None = None
    database: Any = None
    locks: LockStore | None = None


def boot_from_env(
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    resources: QueueResources | None = None,
    environ: Mapping[str, str] | None = None,
) -> QueueManager:
    raise ConfigurationError("booting from the environment is not available yet")


def boot_from_config(
    config: Any,
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    resources: QueueResources | None = None,
    environ: Mapping[str, str] | None = None,
) -> QueueManager:
    raise ConfigurationError("booting from a queues section is not available yet")
