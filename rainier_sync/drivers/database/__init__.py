"""The database driver: jobs in a table of SQLite, PostgreSQL or MariaDB/MySQL.

SQLite needs nothing beyond the standard library; PostgreSQL needs the
``postgres`` extra (psycopg 3) and MariaDB/MySQL the ``mysql`` extra (PyMySQL),
imported only when a URL of that dialect is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import DatabaseUnavailableError, SchemaMissingError
from ._queue import DatabaseQueue
from ._schema import Migration

if TYPE_CHECKING:
    from ...locks.database import DatabaseLockStore

__all__ = ["DatabaseQueue", "DatabaseLockStore", "DatabaseUnavailableError", "Migration", "SchemaMissingError"]


def __getattr__(name: str) -> Any:
    # The lock store lives in rainier_sync.locks.database, which imports this package.
    if name == "DatabaseLockStore":
        from ...locks.database import DatabaseLockStore

        return DatabaseLockStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
