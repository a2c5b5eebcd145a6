"""The caller's open connection given to ``within(...)``: which driver's it is,
and whether it is on the database a table of ours lives in (the queue's, or
the outbox's), so a job written on it commits with the caller's transaction."""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from typing import Any

from ._sqlalchemy import dbapi_connection, is_sqlalchemy
from .url import MYSQL, POSTGRESQL, SQLITE, DatabaseUrl

__all__ = ["caller_connection"]


def caller_connection(obj: Any, target: DatabaseUrl, whose: str) -> tuple[Any, str]:
    """The DBAPI connection under ``obj`` (sqlite3, psycopg 3 or PyMySQL, or a
    SQLAlchemy 2 ``Connection`` or ``Session`` over one of them) and its
    dialect, once it is known to be on ``target``'s database. ``whose`` names
    that database in errors (``"the queue"``). Raises ``TypeError`` naming both."""
    described = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if is_sqlalchemy(obj):
        conn, dialect, described = dbapi_connection(obj)
    elif isinstance(obj, sqlite3.Connection):
        conn, dialect = obj, SQLITE
    else:
        module = type(obj).__module__.split(".")[0]
        conn, dialect = obj, {"psycopg": POSTGRESQL, "pymysql": MYSQL}.get(module, "")
    if dialect != target.dialect:
        raise TypeError(
            f"dispatch within a transaction needs an open {target.dialect} connection to {whose}'s database "
            f"({target.where}); got {described}"
        )
    if dialect == SQLITE:
        _same_sqlite_file(conn, target, whose)
    else:
        _same_database(conn, target, whose, described)
    return conn, dialect


def _same_sqlite_file(conn: sqlite3.Connection, target: DatabaseUrl, whose: str) -> None:
    rows = conn.execute("PRAGMA database_list").fetchall()
    files = {os.path.realpath(row[2]) for row in rows if row[1] == "main" and row[2]}
    ours = os.path.realpath(target.path)
    if files and ours not in files:
        raise TypeError(
            f"dispatch within a transaction: that connection is on the SQLite file {sorted(files)[0]}, "
            f"not on {whose}'s file {ours}"
        )


def _same_database(conn: Any, target: DatabaseUrl, whose: str, described: str) -> None:
    """Refuse a connection to another database of the server (or another server's
    database of another name); hosts are not compared, as one may have several names."""
    ours = urllib.parse.unquote(urllib.parse.urlsplit(target.url).path.lstrip("/"))
    if target.dialect == POSTGRESQL:
        theirs = conn.info.dbname
    else:
        theirs = conn.db
        theirs = theirs.decode() if isinstance(theirs, bytes) else theirs
    if ours and theirs and theirs != ours:
        raise TypeError(
            f"dispatch within a transaction: {described} is connected to the database {theirs!r}, "
            f"but {whose} is in {target.label}"
        )
