"""Unique jobs' locks taken in the caller's transaction, for a dispatch
``.within(conn)`` to the database driver when the lock store keeps its locks in
that same database: the lock commits with the job, or rolls back with it, so a
rolled-back dispatch leaves no lock to drop the next dispatch of that job as a
duplicate.

The statements are the lock store's own (insert the lock, or take over one
that lapsed), written on the caller's connection. While the caller's
transaction is open its lock row is held: another dispatch of the same job
waits for that transaction to end, and then finds the lock taken (it
committed) or free (it rolled back).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ... import _clock
from ._schema import LOCKS
from .dialects import dialect_for
from .url import MYSQL, SQLITE, DatabaseUrl

__all__ = ["same_database", "take_within", "give_back_within"]


def same_database(a: DatabaseUrl, b: DatabaseUrl) -> bool:
    """Whether ``a`` and ``b`` name one database (and, on PostgreSQL, one ``search_path``):
    a table written through one is the table read through the other."""
    if a.dialect != b.dialect:
        return False
    if a.dialect == SQLITE:
        return os.path.realpath(a.path) == os.path.realpath(b.path)
    return a.where == b.where and a.options.get("options") == b.options.get("options")


def take_within(conn: Any, dialect: str, wanted: Sequence[tuple[str, str, float]]) -> list[bool]:
    """Take each ``(key, owner, ttl)`` lock on the caller's DBAPI connection, in its
    transaction; which were taken (a lock another owner holds is not). Keys are
    taken in sorted order, so two such dispatches never wait on each other in a circle."""
    sql = dialect_for(dialect)
    if dialect == MYSQL:
        upsert = sql(
            f"INSERT INTO {LOCKS} (lock_key, owner, expires_at) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
            "owner = IF(expires_at <= %s, VALUES(owner), owner), "
            "expires_at = IF(expires_at <= %s, VALUES(expires_at), expires_at)"
        )
    else:
        upsert = sql(
            f"INSERT INTO {LOCKS} (lock_key, owner, expires_at) VALUES (%s, %s, %s) ON CONFLICT (lock_key) "
            f"DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at WHERE {LOCKS}.expires_at <= %s"
        )
    # The owner is read back rather than the rows changed counted: a client's FOUND_ROWS
    # flag (SQLAlchemy sets it on MySQL) counts a lock held by another owner as changed.
    read = sql(f"SELECT owner FROM {LOCKS} WHERE lock_key = %s")
    cursor = conn.cursor()
    taken: dict[int, bool] = {}
    for index in sorted(range(len(wanted)), key=lambda i: wanted[i][0]):
        key, owner, ttl = wanted[index]
        now = _clock.now()
        if dialect == MYSQL:
            cursor.execute(upsert, (key, owner, now + float(ttl), now, now))
        else:
            cursor.execute(upsert, (key, owner, now + float(ttl), now))
        cursor.execute(read, (key,))
        row = cursor.fetchone()
        taken[index] = row is not None and str(row[0]) == owner
    return [taken[index] for index in range(len(wanted))]


def give_back_within(conn: Any, dialect: str, held: Sequence[tuple[str, str]]) -> None:
    """Delete ``(key, owner)`` locks on the caller's connection, in its transaction."""
    cursor = conn.cursor()
    delete = dialect_for(dialect)(f"DELETE FROM {LOCKS} WHERE lock_key = %s AND owner = %s")
    for key, owner in held:
        cursor.execute(delete, (key, owner))
