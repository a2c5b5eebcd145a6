"""Connections per dialect, reconnecting, and the bounds on an outage.

Only this module imports the optional database clients (psycopg, PyMySQL), and
only when a URL of their dialect is opened.

Every operation that cannot reach the server ends in
:class:`DatabaseUnavailableError` within a bound: a statement waits at most
``response_timeout`` seconds for the server's reply (a frozen server process
looks exactly like a slow one to the client, so the connection is then
treated as lost), and a lost connection is reopened for at most
``reconnect_for`` seconds, each attempt bounded by ``connect_timeout``.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
import urllib.parse
from typing import Any, Callable, TypeVar

from ... import _clock
from ...errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    DriverUnavailableError,
    SchemaMissingError,
)
from ._watchdog import watched_connection_class
from .url import CONNECT_TIMEOUT, DIALECTS, MYSQL, POSTGRESQL, RECONNECT_FOR, RESPONSE_TIMEOUT, SQLITE, DatabaseUrl

__all__ = [
    "CONNECT_TIMEOUT",
    "DIALECTS",
    "MYSQL",
    "POSTGRESQL",
    "RECONNECT_FOR",
    "RESPONSE_TIMEOUT",
    "SQLITE",
    "Database",
    "DatabaseUrl",
    "connect",
    "connection_errors",
    "data_errors",
]

log = logging.getLogger("rainier_sync")

T = TypeVar("T")

#: Pages of write-ahead log after which a commit checkpoints it (SQLite's own default is 1,000).
_SQLITE_CHECKPOINT_PAGES = 10_000


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - depends on the environment
        raise DriverUnavailableError(
            "the database driver needs psycopg for PostgreSQL: pip install 'rainier_sync[postgres]'"
        ) from None
    return psycopg


def _import_pymysql() -> Any:
    try:
        import pymysql
    except ImportError:  # pragma: no cover - depends on the environment
        raise DriverUnavailableError(
            "the database driver needs PyMySQL for MariaDB/MySQL: pip install 'rainier_sync[mysql]'"
        ) from None
    return pymysql


def connection_errors(dialect: str) -> tuple[type[BaseException], ...]:
    """Exceptions that may mean the connection is gone."""
    if dialect == POSTGRESQL:
        psycopg = _import_psycopg()
        return (psycopg.OperationalError, psycopg.InterfaceError)
    if dialect == MYSQL:
        pymysql = _import_pymysql()
        return (pymysql.err.OperationalError, pymysql.err.InterfaceError)
    return ()


def data_errors(dialect: str) -> tuple[type[BaseException], ...]:
    """Exceptions meaning the database (or its client) refused a value it was given."""
    own: tuple[type[BaseException], ...] = (UnicodeEncodeError, OverflowError)
    if dialect == POSTGRESQL:
        return (_import_psycopg().DataError, *own)
    if dialect == MYSQL:
        return (_import_pymysql().err.DataError, *own)
    return (sqlite3.DataError, *own)


# -- opening connections ------------------------------------------------------------------------


def connect(
    target: DatabaseUrl,
    *,
    application_name: str = "rainier_sync",
    init: tuple[str, ...] = (),
    response_timeout: float = RESPONSE_TIMEOUT,
    create: bool = False,
) -> Any:
    """Open one connection in autocommit mode (the driver opens its own transactions),
    then run the ``init`` statements on it.

    Raises :class:`DatabaseUnavailableError` when the server cannot be reached,
    :class:`~rainier_sync.errors.ConfigurationError` when it answers and refuses
    (no such database, wrong password), and :class:`SchemaMissingError` for a
    SQLite file that does not exist unless ``create``.
    """
    conn = _open(target, application_name, response_timeout, create)
    if init:
        try:
            cursor = conn.cursor()
            for statement in init:
                cursor.execute(statement)
        except Exception as exc:
            _close_quietly(conn)
            if isinstance(exc, connection_errors(target.dialect)):
                raise DatabaseUnavailableError(f"{target.label} failed while opening a connection: {exc}") from exc
            raise
    return conn


#: libpq TCP keepalives: a dead peer is noticed in about a minute (30 s idle, then 3 probes 10 s apart).
_PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
#: PostgreSQL refusals that pass: the server is starting, stopping or full, not misconfigured.
_PG_TRANSIENT = (
    "starting up",
    "shutting down",
    "not yet accepting",
    "in recovery mode",
    "too many clients",
    "remaining connection slots",
    "terminating connection",
)
#: MariaDB/MySQL refusals that are configuration mistakes: access denied, no such database, auth plugin.
_MYSQL_REFUSALS = {1044, 1045, 1049, 1251, 1698, 2059}


def _open(target: DatabaseUrl, application_name: str, response_timeout: float, create: bool) -> Any:
    opts = target.options
    if target.dialect == SQLITE:
        return _open_sqlite(target, create)
    if target.dialect == POSTGRESQL:
        psycopg = _import_psycopg()
        url = target.url
        scheme, rest = url.split("://", 1)
        if scheme != "postgresql":
            url = "postgresql://" + rest
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in opts:
            kwargs["connect_timeout"] = CONNECT_TIMEOUT
        if "application_name" not in opts:
            kwargs["application_name"] = application_name
        # A peer that vanished without closing (a half-open TCP connection) would
        # otherwise hang an idle connection's next statement for as long as the
        # kernel's own keepalive: hours.
        for key, value in _PG_KEEPALIVES.items():
            if key not in opts:
                kwargs[key] = value
        if not target.listen:
            # A transaction-pooling proxy hands each transaction to any server
            # session, where a statement prepared on another is unknown.
            kwargs["prepare_threshold"] = None
        try:
            conn = watched_connection_class(psycopg).connect(url, **kwargs)
        except psycopg.OperationalError as exc:
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            message = f"cannot connect to PostgreSQL at {target.where}: {first}"
            refused = ("FATAL:" in text and not any(t in text for t in _PG_TRANSIENT)) or "password" in text
            if refused:
                raise ConfigurationError(message) from exc
            raise DatabaseUnavailableError(message) from exc
        conn.response_timeout = response_timeout
        return conn
    pymysql = _import_pymysql()
    parts = urllib.parse.urlsplit(target.url)
    try:
        return pymysql.connect(
            host=parts.hostname or "localhost",
            port=parts.port or 3306,
            user=urllib.parse.unquote(parts.username or "root"),
            password=urllib.parse.unquote(parts.password or ""),
            database=parts.path.lstrip("/") or None,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=int(opts.get("connect_timeout", CONNECT_TIMEOUT)),
            # Socket timeouts: a server that stops answering ends the wait.
            read_timeout=float(opts.get("read_timeout", response_timeout)),
            write_timeout=float(opts.get("write_timeout", response_timeout)),
            # A value that does not fit is refused, never cut to fit, whatever the server's default.
            init_command="SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_TRANS_TABLES')",
        )
    except pymysql.err.MySQLError as exc:
        code = exc.args[0] if exc.args else None
        message = f"cannot connect to MySQL/MariaDB at {target.where}: {exc.args[-1] if exc.args else exc}"
        if code in _MYSQL_REFUSALS:
            raise ConfigurationError(message) from exc
        raise DatabaseUnavailableError(message) from exc


def _open_sqlite(target: DatabaseUrl, create: bool) -> sqlite3.Connection:
    opts = target.options
    busy_ms = int(opts.get("busy_timeout", "10000"))
    path = target.path
    if path == ":memory:":
        uri, is_uri = path, False
    else:
        absolute = os.path.abspath(path)
        directory = os.path.dirname(absolute)
        if not os.path.isdir(directory):
            raise ConfigurationError(f"SQLite database {path!r}: directory {directory!r} does not exist")
        if not create and not os.path.exists(absolute):
            raise SchemaMissingError(
                f"the SQLite database file {path} does not exist: run DatabaseQueue.migrate() "
                "(or `rainier-sync queue:migrate`) to create it"
            )
        # Only a migration creates the file: a typo in DATABASE_URL must not leave an empty database behind.
        uri, is_uri = f"file:{urllib.parse.quote(absolute)}?mode={'rwc' if create else 'rw'}", True
    try:
        conn = sqlite3.connect(uri, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False, uri=is_uri)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={opts.get('synchronous', 'NORMAL').upper()}")
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        # A queue's table churns: every job is inserted, updated and deleted. Fewer,
        # larger checkpoints (each syncs the log and the file) cost its writers less.
        conn.execute(f"PRAGMA wal_autocheckpoint={int(opts.get('wal_autocheckpoint', _SQLITE_CHECKPOINT_PAGES))}")
    except sqlite3.Error as exc:
        raise ConfigurationError(f"cannot open SQLite database {path!r}: {exc}") from exc
    return conn


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - it is already gone
        pass


#: SQLite errors that mean "not now" (another connection holds the lock past
#: busy_timeout, the disk failed), not a mistake in the statement.
_SQLITE_UNAVAILABLE = ("locked", "busy", "disk i/o error", "unable to open database file")


class Database:
    """One connection shared by the threads of a process, behind a lock.

    A lost connection (server restart, ``pg_terminate_backend``, a proxy that
    dropped it, a server that stopped answering) is opened again with an
    exponential backoff for up to ``reconnect_for`` seconds, and the operation
    that met the loss is retried once on the new connection; every operation
    the driver runs this way is safe to repeat. An operation that cannot reach
    the server raises :class:`DatabaseUnavailableError` within
    :attr:`give_up_after` seconds. Once one has given up, later operations try
    one connection each until the server answers again, so callers hear of a
    long outage within ``connect_timeout``.
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
        self.reconnect_for = _bound("reconnect_for", reconnect_for, target.reconnect_for, RECONNECT_FOR, zero=True)
        self.response_timeout = _bound(
            "response_timeout", response_timeout, target.response_timeout, RESPONSE_TIMEOUT, zero=False
        )
        self.application_name = application_name
        self.init = init
        self.lock = threading.RLock()
        self._lost = connection_errors(self.dialect)
        self._down_since: float | None = None
        self._pid = os.getpid()
        self._orphans: list[Any] = []
        self._conn: Any = None
        if self.dialect == SQLITE and target.path != ":memory:":
            absolute = os.path.abspath(target.path)
            directory = os.path.dirname(absolute)
            if not os.path.isdir(directory):
                raise ConfigurationError(f"SQLite database {target.path!r}: directory {directory!r} does not exist")
            if not os.path.exists(absolute):
                return  # created by a migration; until then every operation says to run one
        self._conn = self._connect()

    @property
    def give_up_after(self) -> float:
        """The most an operation waits before :class:`DatabaseUnavailableError`: a
        reply that never came, reconnecting, and the retried statement's own reply."""
        if self.dialect == SQLITE:
            return 2 * int(self.target.options.get("busy_timeout", "10000")) / 1000 + 5
        return 2 * self.response_timeout + self.reconnect_for + self.target.connect_timeout

    @property
    def connection(self) -> Any:
        """The live connection (reopened after a fork or a loss). Hold :attr:`lock`."""
        if self._pid != os.getpid():
            # A forked child must not close (and so terminate) its parent's session.
            self._orphans.append(self._conn)
            self._conn = None
            self._pid = os.getpid()
        if self._conn is None:
            self._reconnect(None)
        return self._conn

    def create(self) -> None:
        """Open the SQLite file, creating it if it does not exist (migrations only)."""
        with self.lock:
            if self.dialect == SQLITE and self._conn is None and self._pid == os.getpid():
                self._conn = self._connect(create=True)

    def _connect(self, create: bool = False) -> Any:
        return connect(
            self.target,
            application_name=self.application_name,
            init=self.init,
            response_timeout=self.response_timeout,
            create=create,
        )

    def is_lost(self, exc: BaseException) -> bool:
        if not self._lost or not isinstance(exc, self._lost):
            return False
        conn = self._conn
        if conn is None:
            return True
        if self.dialect == POSTGRESQL:
            return bool(conn.closed or conn.broken)
        if self.dialect == MYSQL:
            code = exc.args[0] if exc.args else None
            return isinstance(code, int) and code in (0, 2006, 2013, 2014, 2045, 2055, 4031)
        return False

    def _why_lost(self, exc: BaseException) -> str:
        if getattr(self._conn, "timed_out", False) or "timed out" in str(exc):
            return f"it did not answer within {self.response_timeout:g} s (response_timeout)"
        text = str(exc).strip()
        return f"the connection was lost ({text.splitlines()[0] if text else type(exc).__name__})"

    def _reconnect(self, lost: BaseException | None) -> None:
        """Open a new connection, retrying for ``reconnect_for`` seconds (one attempt
        while the server is known to be down); raises DatabaseUnavailableError."""
        why = self._why_lost(lost) if lost is not None else None
        self._drop()
        down = self._down_since is not None
        started = _clock.monotonic()
        deadline = started + (0.0 if down else self.reconnect_for)
        pause = 0.05
        while True:
            try:
                self._conn = self._connect()
            except DatabaseUnavailableError as exc:
                remaining = deadline - _clock.monotonic()
                if remaining > 0:
                    time.sleep(min(pause, remaining))
                    pause = min(pause * 2, 2.0)
                    continue
                if self._down_since is None:
                    self._down_since = started
                raise DatabaseUnavailableError(self._give_up_message(why, exc, down)) from exc
            break
        if down or lost is not None:
            log.info("reconnected to %s", self.target.label)
        self._down_since = None

    def _give_up_message(self, why: str | None, exc: DatabaseUnavailableError, down: bool) -> str:
        last = str(exc)
        if down and self._down_since is not None:
            for_how_long = _clock.monotonic() - self._down_since
            return f"{self.target.label} is still unreachable ({for_how_long:.0f} s so far): {last}"
        tried = f"reconnecting failed for {self.reconnect_for:g} s (reconnect_for): {last}"
        if why is None:
            return f"{self.target.label} cannot be reached: {tried}"
        return f"{self.target.label} cannot be reached: {why}, and {tried}"

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)

    def run(self, fn: Callable[[Any], T]) -> T:
        """``fn(connection)`` under the lock; reconnect and retry once if the connection
        was lost. Raises :class:`DatabaseUnavailableError` when the server cannot be reached."""
        if not self.lock.acquire(timeout=self.give_up_after):
            raise DatabaseUnavailableError(
                f"{self.target.label} is not answering: waited {self.give_up_after:g} s for its connection, "
                "which another operation holds while it tries to reach the server"
            )
        try:
            try:
                return fn(self.connection)
            except Exception as exc:
                if not self.is_lost(exc):
                    self._raise_unavailable_sqlite(exc)
                    raise
                log.warning("lost the connection to %s (%s); reconnecting", self.target.label, exc)
                self._reconnect(exc)
            try:
                return fn(self._conn)
            except Exception as exc:
                if not self.is_lost(exc):
                    raise
                why = self._why_lost(exc)
                self._drop()
                raise DatabaseUnavailableError(
                    f"{self.target.label} cannot be reached: {why}, again just after reconnecting"
                ) from exc
        finally:
            self.lock.release()

    def _raise_unavailable_sqlite(self, exc: BaseException) -> None:
        if self.dialect == SQLITE and isinstance(exc, sqlite3.OperationalError):
            text = str(exc)
            if any(marker in text.lower() for marker in _SQLITE_UNAVAILABLE):
                raise DatabaseUnavailableError(f"{self.target.label} is not available: {text}") from exc

    def close(self) -> None:
        with self.lock:
            if self._pid == os.getpid():
                self._drop()
            self._conn = None


def _bound(name: str, given: float | None, from_url: float | None, default: float, *, zero: bool) -> float:
    if given is None:
        return default if from_url is None else from_url
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not math.isfinite(given):
        raise ValueError(f"{name} must be a number of seconds, got {given!r}")
    if given < 0 or (given == 0 and not zero):
        raise ValueError(f"{name} must be a number of seconds{' >= 0' if zero else ' above 0'}, got {given!r}")
    return float(given)
