"""The database store of the coordination state: unique-job locks, Kafka's job
leases, job middleware's windows, counters and flags (paused queues), results,
batches' tallies and the workers' records in tables of SQLite, PostgreSQL or
MariaDB/MySQL, shared by every process that opens the same database."""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from ... import _clock
from ...state.base import StateStore, rooms_of, take_from
from ...types import float_text
from ._connection import MYSQL, POSTGRESQL, SQLITE, DatabaseUrl
from ._pg_listen import ValueListener, notifying_key
from ._pg_tally import ADD, SETTLE, read_settled, settle_params
from ._schema import COUNTERS, FLAGS, LOCKS, TALLIES, TALLY_MEMBERS, VALUES, WINDOWS, migrate
from .backend import _Backend

__all__ = ["DatabaseLockStore"]


class DatabaseLockStore(StateStore):
    """Locks in a table of the application's database: insert-if-absent with an
    expiry, released and renewed only by their owner; beside them the windows,
    counters and flags of job middleware and paused queues (migration 2).
    Every expiry and window follows the library's clock."""

    def __init__(
        self,
        url: str | None = None,
        *,
        reconnect_for: float | None = None,
        response_timeout: float | None = None,
        _backend: Any = None,
    ) -> None:
        if _backend is None:
            if url is None:
                raise ValueError("DatabaseLockStore needs a database URL")
            _backend = _Backend(
                DatabaseUrl.parse(url),
                reconnect_for=reconnect_for,
                response_timeout=response_timeout,
                application_name="rainier_sync",
            )
        self._backend: _Backend = _backend
        self._owns_connection = url is not None
        self.dialect = self._backend.dialect
        #: The LISTEN connection of ``wait_value`` on PostgreSQL, opened by the first wait.
        self._listener: ValueListener | None = None
        self._listener_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DatabaseLockStore:
        """Connect to ``url`` (same forms as :meth:`DatabaseQueue.from_url`)."""
        return cls(url, **options)

    def migrate(self) -> list[int]:
        """Create the tables (the lock table comes with the queue's migrations)."""
        return migrate(self._backend.db)

    # Every expiry is read when its statement runs (after a reconnect too; on
    # SQLite once the write lock is held), so a lock never starts out expired.
    def acquire(self, key: str, owner: str, ttl: float) -> bool:
        ttl = float(ttl)
        if self.dialect == MYSQL:

            def mysql_params() -> tuple[Any, ...]:
                now = _clock.now()
                return (key, owner, now + ttl, now, now)

            # Affected rows: 1 inserted, 2 taken over an expired lock, 0 held by someone.
            changed: int = self._backend.stamped(
                f"INSERT INTO {LOCKS} (lock_key, owner, expires_at) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
                "owner = IF(expires_at <= %s, VALUES(owner), owner), "
                "expires_at = IF(expires_at <= %s, VALUES(expires_at), expires_at)",
                mysql_params,
            )
            return changed > 0

        def params() -> tuple[Any, ...]:
            now = _clock.now()
            return (key, owner, now + ttl, now)

        changed = self._backend.stamped(
            f"INSERT INTO {LOCKS} (lock_key, owner, expires_at) VALUES (%s, %s, %s) ON CONFLICT (lock_key) "
            f"DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at WHERE {LOCKS}.expires_at <= %s",
            params,
        )
        return changed > 0

    def release(self, key: str, owner: str) -> bool:
        released: int = self._backend.stamped(
            f"DELETE FROM {LOCKS} WHERE lock_key = %s AND owner = %s AND expires_at > %s",
            lambda: (key, owner, _clock.now()),
        )
        return released > 0

    def renew(self, key: str, owner: str, ttl: float) -> bool:
        ttl = float(ttl)

        def params() -> tuple[Any, ...]:
            now = _clock.now()
            return (now + ttl, key, owner, now)

        renewed: int = self._backend.stamped(
            f"UPDATE {LOCKS} SET expires_at = %s WHERE lock_key = %s AND owner = %s AND expires_at > %s", params
        )
        return renewed > 0

    def owner(self, key: str) -> str | None:
        rows = self._backend.query(
            f"SELECT owner FROM {LOCKS} WHERE lock_key = %s AND expires_at > %s", lambda: (key, _clock.now())
        )
        return str(rows[0][0]) if rows else None

    # -- coordination: each check holds its row (SQLite: the write lock) while it
    # reads the library's clock, so freezegun moves windows and two workers never
    # both take the last place in one.
    def take(self, key: str, limit: int, per: float) -> float:
        taken, rooms = self.take_many(key, 1, limit, per)
        return 0.0 if taken else rooms[0]

    def take_many(self, key: str, n: int, limit: int, per: float, hold: float = 0.0) -> tuple[int, list[float]]:
        """A window is one row: its batches of starts as text, ``stamp*count``
        (``stamp`` alone is one start). On PostgreSQL one statement (an upsert
        whose update reads the row it holds); elsewhere one transaction."""
        per, hold = float(per), float(hold)
        if self.dialect == POSTGRESQL:
            return self._take_many_in_one(key, n, limit, per, hold)
        sql = self._backend.sql

        def check(cursor: Any) -> tuple[int, list[float]]:
            cursor.execute(sql(self._insert_absent(WINDOWS, "window_key, starts", "%s, ''")), (key,))
            cursor.execute(sql(f"SELECT starts FROM {WINDOWS} WHERE window_key = %s{self._for_update}"), (key,))
            now = _clock.now()
            kept, taken, rooms = take_from(_batches(str(cursor.fetchone()[0])), n, limit, per, now, now + hold)
            cursor.execute(sql(f"UPDATE {WINDOWS} SET starts = %s WHERE window_key = %s"), (_window_text(kept), key))
            return taken, rooms

        return self._backend.transaction(check)

    def _take_many_in_one(self, key: str, n: int, limit: int, per: float, hold: float) -> tuple[int, list[float]]:
        # ON CONFLICT DO UPDATE reads the newest version of the row it has locked,
        # so the batches it keeps are those every earlier take left.
        clock: list[float] = []

        def params() -> tuple[Any, ...]:
            now = _clock.now()
            clock[:] = [now]
            stamp = float_text(now + hold)
            return (key, f"{stamp}*{min(n, limit)}", stamp, n, limit, now - per)

        rows = self._backend.stamped(
            f"INSERT INTO {WINDOWS} AS w (window_key, starts) VALUES (%s, %s) "
            "ON CONFLICT (window_key) DO UPDATE SET starts = ("
            "SELECT concat_ws(' ', string_agg(tok, ' '), "
            "%s::text || '*' || LEAST(%s::bigint, GREATEST(0, %s::bigint - COALESCE(SUM(n), 0)))) "
            "FROM (SELECT tok, COALESCE(NULLIF(split_part(tok, '*', 2), ''), '1')::bigint AS n "
            "FROM unnest(string_to_array(w.starts, ' ')) AS tok "
            "WHERE tok <> '' AND split_part(tok, '*', 1)::float8 > %s::float8) AS kept WHERE n > 0"
            ") RETURNING starts",
            params,
            fetch=True,
        )
        batches = _batches(str(rows[0][0]))
        taken = batches[-1][1]
        return taken, rooms_of([b for b in batches if b[1] > 0], limit, per, clock[0])

    def count(self, key: str, window: float) -> int:
        sql, window = self._backend.sql, float(window)

        def bump(cursor: Any) -> int:
            cursor.execute(sql(self._insert_absent(COUNTERS, "counter_key, hits, lapses_at", "%s, 0, 0")), (key,))
            cursor.execute(
                sql(f"SELECT hits, lapses_at FROM {COUNTERS} WHERE counter_key = %s{self._for_update}"), (key,)
            )
            hits, lapses_at = cursor.fetchone()
            now = _clock.now()
            hits = int(hits) + 1 if float(lapses_at) > now else 1
            cursor.execute(
                sql(f"UPDATE {COUNTERS} SET hits = %s, lapses_at = %s WHERE counter_key = %s"),
                (hits, now + window, key),
            )
            return hits

        return self._backend.transaction(bump)

    def counted(self, key: str) -> tuple[int, float]:
        rows = self._backend.query(
            f"SELECT hits, lapses_at FROM {COUNTERS} WHERE counter_key = %s AND lapses_at > %s",
            lambda: (key, _clock.now()),
        )
        return (int(rows[0][0]), float(rows[0][1])) if rows else (0, 0.0)

    def reset(self, key: str) -> None:
        self._backend.execute(f"DELETE FROM {COUNTERS} WHERE counter_key = %s", (key,))

    def set_flag(self, group: str, member: str, on: bool) -> None:
        if on:
            self._backend.execute(self._insert_absent(FLAGS, "flag_group, member", "%s, %s"), (group, member))
        else:
            self._backend.execute(f"DELETE FROM {FLAGS} WHERE flag_group = %s AND member = %s", (group, member))

    def flags(self, group: str) -> set[str]:
        rows = self._backend.query(f"SELECT member FROM {FLAGS} WHERE flag_group = %s", (group,))
        return {str(row[0]) for row in rows}

    def put_value(self, key: str, value: str, ttl: float) -> None:
        ttl = float(ttl)
        if self.dialect == MYSQL:
            sql = (
                f"INSERT INTO {VALUES} (value_key, value, expires_at) VALUES (%s, %s, %s) "
                "ON DUPLICATE KEY UPDATE value = VALUES(value), expires_at = VALUES(expires_at)"
            )
        else:
            sql = (
                f"INSERT INTO {VALUES} (value_key, value, expires_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (value_key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
            )
            if self.dialect == POSTGRESQL:  # waiters wake on commit (and only then)
                sql = f"WITH put AS ({sql} RETURNING value_key) SELECT {notifying_key('value_key')} FROM put"
        self._backend.stamped(sql, lambda: (key, value, _clock.now() + ttl))

    def get_value(self, key: str) -> str | None:
        rows = self._backend.query(
            f"SELECT value FROM {VALUES} WHERE value_key = %s AND expires_at > %s", lambda: (key, _clock.now())
        )
        return str(rows[0][0]) if rows else None

    def wait_value(self, key: str, timeout: float, done: Callable[[str | None], bool]) -> str | None:
        """On PostgreSQL woken by ``NOTIFY`` (:mod:`._pg_listen`); it polls behind a
        transaction-pooling proxy (``listen=false``) and on the other dialects."""
        if self.dialect != POSTGRESQL or not self._backend.target.listen:
            return super().wait_value(key, timeout, done)
        deadline = _clock.monotonic() + max(0.0, timeout)
        value = self.get_value(key)
        if done(value) or timeout <= 0:
            return value
        listener = self._listener
        if listener is None:
            with self._listener_lock:
                listener = self._listener = self._listener or ValueListener(self._backend.db)
        with listener.watching(key):
            listener.listen()  # listening before the next read: a put after it wakes the wait
            while True:
                mark = listener.mark(key)
                value = self.get_value(key)
                left = deadline - _clock.monotonic()
                if done(value) or left <= 0:
                    return value
                listener.wait(key, mark, min(left, 1.0))

    # -- tallies: each change one transaction holding the tally's rows
    def tally_add(self, key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        sql, ttl = self._backend.sql, float(ttl)

        def add(cursor: Any) -> dict[str, int]:
            self._lock_rows(cursor, key)
            until = _clock.now() + ttl
            if self.dialect == POSTGRESQL and counts:  # every field in one statement
                fields = sorted(counts)
                cursor.execute(ADD, (key, until, fields, [int(counts[field]) for field in fields]))
                return {str(field): int(n) for field, n in cursor.fetchall()}
            for field, n in counts.items():
                cursor.execute(
                    sql(self._insert_absent(TALLIES, "tally_key, field, n, expires_at", "%s, %s, 0, %s")),
                    (key, field, until),
                )
                cursor.execute(
                    sql(f"UPDATE {TALLIES} SET n = n + %s WHERE tally_key = %s AND field = %s"), (int(n), key, field)
                )
            return self._touch(cursor, key, until)

        return self._backend.transaction(add)

    def tally_settle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        if self.dialect == POSTGRESQL:  # one statement, whose steps take the rows in the order every change does
            return self.tally_settle_many([(key, member, field, ttl)])[0]
        sql, ttl = self._backend.sql, float(ttl)

        def settle(cursor: Any) -> tuple[dict[str, int], bool]:
            self._lock_rows(cursor, key)
            until = _clock.now() + ttl
            cursor.execute(
                sql(self._insert_absent(TALLY_MEMBERS, "tally_key, member, expires_at", "%s, %s, %s")),
                (key, member, until),
            )
            new = cursor.rowcount == 1
            if new:
                for name, n in ((field, 1), ("pending", -1)):
                    update = sql(f"UPDATE {TALLIES} SET n = n + %s WHERE tally_key = %s AND field = %s")
                    cursor.execute(update, (n, key, name))
                    if cursor.rowcount == 0:  # a count the tally did not start with
                        cursor.execute(
                            sql(self._insert_absent(TALLIES, "tally_key, field, n, expires_at", "%s, %s, 0, %s")),
                            (key, name, until),
                        )
                        cursor.execute(update, (n, key, name))
            return self._touch(cursor, key, until), new

        return self._backend.transaction(settle)

    def tally_settle_many(self, items: Sequence[tuple[str, str, str, float]]) -> list[tuple[dict[str, int], bool]]:
        """One transaction for every item: the tallies' rows locked in key order,
        the new members found by one insert, then one update per count changed.
        On PostgreSQL one statement (:mod:`._pg_tally`)."""
        if not items:
            return []
        if self.dialect == POSTGRESQL:
            rows = self._backend.stamped(SETTLE, lambda: settle_params(items, _clock.now()), fetch=True)
            return read_settled(rows, items)
        sql = self._backend.sql
        ttls: dict[str, float] = {}
        for key, _, _, ttl in items:
            ttls[key] = max(ttls.get(key, 0.0), float(ttl))
        keys = sorted(ttls)

        def settle(cursor: Any) -> list[tuple[dict[str, int], bool]]:
            for key in keys:
                self._lock_rows(cursor, key)
            now = _clock.now()
            news = self._insert_members(cursor, items, now, ttls)
            deltas: dict[tuple[str, str], int] = {}
            for (key, _, field, _), new in zip(items, news, strict=True):
                if new:
                    deltas[(key, field)] = deltas.get((key, field), 0) + 1
                    deltas[(key, "pending")] = deltas.get((key, "pending"), 0) - 1
            update = sql(f"UPDATE {TALLIES} SET n = n + %s WHERE tally_key = %s AND field = %s")
            for (key, name), n in sorted(deltas.items()):
                if n == 0:
                    continue
                cursor.execute(update, (n, key, name))
                if cursor.rowcount == 0:  # a count the tally did not start with
                    cursor.execute(
                        sql(self._insert_absent(TALLIES, "tally_key, field, n, expires_at", "%s, %s, 0, %s")),
                        (key, name, now + ttls[key]),
                    )
                    cursor.execute(update, (n, key, name))
            counts = {key: self._touch(cursor, key, now + ttls[key]) for key in keys}
            return [(dict(counts[item[0]]), new) for item, new in zip(items, news, strict=True)]

        return self._backend.transaction(settle)

    def tally_unsettle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        sql, ttl = self._backend.sql, float(ttl)

        def unsettle(cursor: Any) -> tuple[dict[str, int], bool]:
            self._lock_rows(cursor, key)
            cursor.execute(sql(f"DELETE FROM {TALLY_MEMBERS} WHERE tally_key = %s AND member = %s"), (key, member))
            there = cursor.rowcount == 1
            if there:
                update = sql(f"UPDATE {TALLIES} SET n = n + %s WHERE tally_key = %s AND field = %s")
                for name, n in (("pending", 1), (field, -1)):
                    cursor.execute(update, (n, key, name))
            return self._touch(cursor, key, _clock.now() + ttl), there

        return self._backend.transaction(unsettle)

    def _insert_members(
        self, cursor: Any, items: Sequence[tuple[str, str, str, float]], now: float, ttls: dict[str, float]
    ) -> list[bool]:
        """Insert each item's member where absent; whether each was new (a member
        twice in ``items`` is new the first time only)."""
        sql = self._backend.sql
        if self.dialect == MYSQL:  # no INSERT ... RETURNING: one insert each
            news = []
            for key, member, _, _ in items:
                cursor.execute(
                    sql(self._insert_absent(TALLY_MEMBERS, "tally_key, member, expires_at", "%s, %s, %s")),
                    (key, member, now + ttls[key]),
                )
                news.append(cursor.rowcount == 1)
            return news
        inserted: set[tuple[str, str]] = set()
        for start in range(0, len(items), 300):
            part = items[start : start + 300]
            values = ", ".join(["(%s, %s, %s)"] * len(part))
            cursor.execute(
                sql(
                    f"INSERT INTO {TALLY_MEMBERS} (tally_key, member, expires_at) VALUES {values} "
                    "ON CONFLICT DO NOTHING RETURNING tally_key, member"
                ),
                [value for key, member, _, _ in part for value in (key, member, now + ttls[key])],
            )
            inserted.update((str(key), str(member)) for key, member in cursor.fetchall())
        news = []
        for key, member, _, _ in items:
            news.append((key, member) in inserted)
            inserted.discard((key, member))
        return news

    def _lock_rows(self, cursor: Any, key: str) -> None:
        """Lock a tally's rows first, in one order, so two changes of one tally
        (settling different fields) wait for each other instead of deadlocking."""
        # PostgreSQL: ``pending`` first, as its one-statement settle takes them.
        order = "field <> 'pending', field" if self.dialect == POSTGRESQL else "field"
        cursor.execute(
            self._backend.sql(f"SELECT field FROM {TALLIES} WHERE tally_key = %s ORDER BY {order}{self._for_update}"),
            (key,),
        )
        cursor.fetchall()

    def _touch(self, cursor: Any, key: str, until: float) -> dict[str, int]:
        sql = self._backend.sql
        cursor.execute(sql(f"UPDATE {TALLIES} SET expires_at = %s WHERE tally_key = %s"), (until, key))
        cursor.execute(sql(f"SELECT field, n FROM {TALLIES} WHERE tally_key = %s"), (key,))
        return {str(field): int(n) for field, n in cursor.fetchall()}

    def tally(self, key: str) -> dict[str, int] | None:
        rows = self._backend.query(
            f"SELECT field, n FROM {TALLIES} WHERE tally_key = %s AND expires_at > %s", lambda: (key, _clock.now())
        )
        return {str(field): int(n) for field, n in rows} or None

    def prune(self) -> int:
        """Delete expired values and tallies (locks and windows stay small on their own)."""
        gone = 0
        for table in (VALUES, TALLIES, TALLY_MEMBERS):
            gone += self._backend.execute(f"DELETE FROM {table} WHERE expires_at <= %s", (_clock.now(),))
        return gone

    @property
    def _for_update(self) -> str:
        # SQLite has no row locks: BEGIN IMMEDIATE already holds the write lock.
        return "" if self.dialect == SQLITE else " FOR UPDATE"

    def _insert_absent(self, table: str, columns: str, values: str) -> str:
        if self.dialect == MYSQL:
            return f"INSERT IGNORE INTO {table} ({columns}) VALUES ({values})"
        return f"INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING"

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._owns_connection:
            self._backend.db.close()


def _batches(text: str) -> list[tuple[float, int]]:
    """A window's text as its batches: ``stamp*count`` each, ``stamp`` alone one start."""
    batches = []
    for token in text.split():
        stamp, _, count = token.partition("*")
        batches.append((float(stamp), int(count) if count else 1))
    return batches


def _window_text(batches: list[tuple[float, int]]) -> str:
    return " ".join(float_text(at) if count == 1 else f"{float_text(at)}*{count}" for at, count in batches)
