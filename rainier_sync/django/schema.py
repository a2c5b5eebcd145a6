"""Creating the queue's tables from ``manage.py migrate``."""

from __future__ import annotations

from typing import Any

__all__ = ["migrate_alias"]

#: Django's vendor names to the database driver's dialects.
_DIALECTS = {"sqlite": "sqlite", "postgresql": "postgresql", "mysql": "mysql"}


def migrate_alias(alias: str) -> list[int]:
    """Apply the database driver's migrations (the queue's tables, the lock
    store's and the outbox's) on Django's connection to ``DATABASES[alias]``,
    whatever database it is on now (a test run's test database included), and
    point the database connections kept there at it. Returns the versions
    applied now. Nothing is done on an alias no connection keeps its jobs (or
    its outbox) in."""
    from django.db import connections

    from ..drivers.database._schema import apply_migrations
    from .conf import database_url
    from .state import booted_manager

    manager: Any = booted_manager()
    if manager is not None:
        used = set(manager.aliases().values()) | {route.outbox for route in manager.plan.routes.values()}
        if alias not in used:
            return []
    connection = connections[alias]
    dialect = _DIALECTS.get(connection.vendor)
    if dialect is None:
        return []
    connection.ensure_connection()
    applied = apply_migrations(connection.connection, dialect)
    name = str(connection.settings_dict.get("NAME") or "")
    in_memory = dialect == "sqlite" and (name in ("", ":memory:") or name.startswith("file:"))
    if manager is not None and not in_memory:
        url = database_url(alias, {alias: connection.settings_dict}, f"DATABASES[{alias!r}]")
        for connection_name, route_alias in manager.aliases().items():
            if route_alias == alias:
                manager.retarget(connection_name, url)
    return applied
