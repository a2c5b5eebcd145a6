"""The manager Django booted, for this process."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..manager import QueueManager

__all__ = ["get_manager", "set_manager"]

_booted: list[QueueManager] = []


def get_manager() -> QueueManager:
    """The manager booted from the settings when Django started (the fake while
    :func:`rainier_sync.django.testing.fake_queue` is active)."""
    from ..manager import instance

    if not _booted:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "rainier_sync.django has not booted: add 'rainier_sync.django' to INSTALLED_APPS and call django.setup()"
        )
    return instance()


def set_manager(manager: QueueManager) -> None:
    _booted[:] = [manager]


def booted_manager() -> QueueManager | None:
    """The manager booted from the settings (never the fake), or None."""
    return _booted[0] if _booted else None
