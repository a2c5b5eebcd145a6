"""The app Django loads for ``"rainier_sync.django"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["RainierSyncConfig"]


class RainierSyncConfig(AppConfig):  # type: ignore[misc]
    """Boots the queue from the settings when Django starts (``ready()``); when
    ``TASKS`` names a rainier_sync backend, imports each app's ``tasks`` module
    and registers its tasks, so a worker knows them."""

    name = "rainier_sync.django"
    label = "rainier_sync"
    verbose_name = "rainier_sync job queues"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django.conf import settings

        from ..manager import set_instance
        from ..scopes import add_attempt_scope
        from . import checks  # noqa: F401 - registers the system checks
        from .conf import boot, uses_tasks_backend
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
        if uses_tasks_backend(settings):
            # A worker runs Django tasks too: each app's tasks module defines them.
            from .conf import discover_tasks

            discover_tasks(manager.registry)
