"""Creating the queue's tables from ``manage.py migrate``."""

from __future__ import annotations

from typing import Any

__all__ = ["migrate_alias"]


def migrate_alias(alias: str) -> list[str]:
    """Apply the driver's migrations on every database connection kept in
    ``DATABASES[alias]``, and the outbox's when it lives there; returns the
    connections migrated. The database is the one Django's connection to the
    alias is on now (a test run's test database included)."""
    from django.db import connections

    from .conf import database_url
    from .state import booted_manager

    manager: Any = booted_manager()
    if manager is None:
        return []
    settings_dict = connections[alias].settings_dict
    url = database_url(alias, {alias: settings_dict}, f"DATABASES[{alias!r}]")
    migrated: list[str] = []
    for name, route_alias in manager.aliases().items():
        if route_alias != alias:
            continue
        manager.retarget(name, url)
        manager.connection(name).migrate()
        migrated.append(name)
    outbox = manager.outbox
    if outbox is not None and any(route.outbox == alias for route in manager.plan.routes.values()):
        outbox.migrate()
        migrated.append("outbox")
    return migrated
