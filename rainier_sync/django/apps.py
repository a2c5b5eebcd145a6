"""The app Django loads for ``"rainier_sync.django"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["RainierSyncConfig"]


class RainierSyncConfig(AppConfig):  # type: ignore[misc]
    """Boots the queue from the settings when Django starts (``ready()``)."""

    name = "rainier_sync.django"
    label = "rainier_sync"
    verbose_name = "rainier_sync job queues"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from ..manager import set_instance
        from ..scopes import add_attempt_scope
        from . import checks  # noqa: F401 - registers the system checks
        from .conf import boot
        from .hygiene import forked_scope, mark_home
        from .state import booted_manager, set_manager

        previous = booted_manager()
        if previous is not None:  # ready() again (a test re-populating the registry): one manager per process
            return
        manager = boot()
        set_manager(manager)
        set_instance(manager)
        mark_home()
        add_attempt_scope(forked_scope)
