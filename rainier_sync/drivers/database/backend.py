"""One database connection with its dialect, its SQL and its errors, shared by
the queue and the lock store."""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from ...errors import PayloadError, RainierError, SchemaMissingError
from ._connection import Database, data_errors
from .dialects import Dialect, dialect_for
from .url import POSTGRESQL, SQLITE, DatabaseUrl

T = TypeVar("T")
#: A statement's parameters, or a function building them when the statement runs.
Params = Sequence[Any] | Callable[[], Sequence[Any]]


def _missing_table(exc: BaseException) -> bool:
    text = str(exc)
    return (
        ("no such table" in text and "rainier_" in text)
        or (type(exc).__name__ == "UndefinedTable" and "rainier_" in text)
        or ("1146" in repr(exc.args[:1]) and "rainier_" in text)
    )


def _rollback(conn: Any, dialect: Dialect) -> None:
    try:
        dialect.rollback(conn)
    except Exception:  # noqa: BLE001 - the original error is the one to raise
        pass


def _in_transaction(conn: Any, dialect: Dialect, fn: Callable[[Any], T]) -> T:
    dialect.begin(conn)
    try:
        cursor = conn.cursor()
        result = fn(cursor)
    except BaseException:
        _rollback(conn, dialect)
        raise
    dialect.commit(conn)
    return result


class _Backend:
    """One connection with its dialect and its SQL.

    Errors reach callers as the library's own: an outage as
    ``DatabaseUnavailableError`` (a ``QueueUnavailableError``), missing tables as
    :class:`SchemaMissingError`, and a value the database refuses (a NUL in
    PostgreSQL text, a number out of range) as ``PayloadError``.
    """

    def __init__(
        self,
        target: DatabaseUrl,
        *,
        reconnect_for: float | None = None,
        response_timeout: float | None = None,
        application_name: str = "rainier_sync",
        init: tuple[str, ...] = (),
    ) -> None:
        self.target = target
        self.dialect = target.dialect
        self.sql = dialect_for(self.dialect)
        self.db = Database(
            target,
            reconnect_for=reconnect_for,
            response_timeout=response_timeout,
            application_name=application_name,
            init=init,
        )
        self._refused = data_errors(self.dialect)

    def run(self, fn: Callable[[Any], T]) -> T:
        try:
            return self.db.run(fn)
        except RainierError:
            raise
        except Exception as exc:
            if _missing_table(exc):
                raise SchemaMissingError(self._missing_tables()) from exc
            if isinstance(exc, self._refused):
                text = str(exc).strip()
                raise PayloadError(
                    f"{self.target.label} refused a value it was given: {text.splitlines()[0] if text else exc!r}"
                ) from exc
            raise

    def _missing_tables(self) -> str:
        """What a missing table says: where it was looked for (on PostgreSQL, the
        schema the search path leads to, where ``migrate`` creates the tables, or
        that it leads to none), and what to do."""
        run = "run DatabaseQueue.migrate() (or `rainier-sync queue:migrate`)"
        label = self.target.label
        if self.dialect == POSTGRESQL:

            def ask(conn: Any) -> tuple[str, str | None]:
                row = conn.execute("SELECT current_setting('search_path'), current_schema()").fetchone()
                return str(row[0]), row[1]

            try:
                path, schema = self.db.run(ask)
            except Exception:  # noqa: BLE001 - the missing table is the error to report
                pass
            else:
                if schema is None:
                    return (
                        f"the queue tables are missing from {label}: its search_path ({path}) names no schema "
                        f"that exists: create the schema, then {run}"
                    )
                label = f'schema "{schema}" (search_path {path}) of {label}'
        return f"the queue tables are missing from {label}: {run} first"

    def _statement(self, sql: str, params: Params, fetch: bool, write_lock: bool) -> Any:
        sql = self.sql(sql)

        def on(cursor: Any) -> Any:
            cursor.execute(sql, tuple(params() if callable(params) else params))
            return list(cursor.fetchall()) if fetch else int(cursor.rowcount)

        if write_lock and self.dialect == SQLITE:
            return self.transaction(on)
        return self.run(lambda conn: on(conn.cursor()))

    def execute(self, sql: str, params: Params = ()) -> int:
        """One statement; returns the rows it changed."""
        result: int = self._statement(sql, params, False, False)
        return result

    def query(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        result: list[tuple[Any, ...]] = self._statement(sql, params, True, False)
        return result

    def stamped(self, sql: str, params: Callable[[], Sequence[Any]], *, fetch: bool = False) -> Any:
        """A write whose parameters read the clock (reservations, due times, lock
        expiries): ``params()`` runs when the statement does, so a deadline is
        never older than the statement that writes it. After a reconnect it runs
        again; on SQLite it runs once the write lock is held. Returns the rows
        (``fetch``) or how many it changed."""
        return self._statement(sql, params, fetch, True)

    def transaction(self, fn: Callable[[Any], T]) -> T:
        """``fn(cursor)`` in one transaction (SQLite: ``BEGIN IMMEDIATE``, taking the write lock up front)."""
        return self.run(lambda conn: _in_transaction(conn, self.sql, fn))
