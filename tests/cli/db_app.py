"""The command-line tests' application on the database driver (SQLite):
``DATABASE_URL`` comes from the environment, the registry from tests.cli.app."""

from __future__ import annotations

from rainier_sync import Container, QueueManager, QueueResources

from .app import registry


def make_manager() -> QueueManager:
    """Factory for ``--app tests.cli.db_app:make_manager``."""
    return QueueManager.from_config(
        {"default": "main", "connections": {"main": {"driver": "database", "reservation": 30}}},
        resources=QueueResources(registry=registry, container=Container()),
    )
