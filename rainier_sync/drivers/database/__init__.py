"""The database driver: jobs in a table of SQLite, PostgreSQL or MariaDB/MySQL.

SQLite needs nothing beyond the standard library; PostgreSQL needs the
``postgres`` extra (psycopg 3) and MariaDB/MySQL the ``mysql`` extra (PyMySQL),
imported only when a URL of that dialect is opened.
"""

from __future__ import annotations

from ...errors import DatabaseUnavailableError, SchemaMissingError
from ._queue import DatabaseQueue
from ._schema import Migration
from .store import DatabaseLockStore

__all__ = ["DatabaseQueue", "DatabaseLockStore", "DatabaseUnavailableError", "Migration", "SchemaMissingError"]
