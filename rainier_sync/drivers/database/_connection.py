"""Database URLs, connections per dialect, and reconnecting with a backoff.

Only this module imports the optional database clients (psycopg, PyMySQL), and
only when a URL of their dialect is opened.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import tenacity

from ...errors import ConfigurationError, DriverUnavailableError

log = logging.getLogger("rainier_sync")

T = TypeVar("T")

SQLITE, POSTGRESQL, MYSQL = "sqlite", "postgresql", "mysql"
DIALECTS = (SQLITE, POSTGRESQL, MYSQL)

_SCHEMES = {
    "sqlite": SQLITE,
    "sqlite3": SQLITE,
    "postgresql": POSTGRESQL,
    "postgres": POSTGRESQL,
    "postgresql+psycopg": POSTGRESQL,
    "mysql": MYSQL,
    "mariadb": MYSQL,
    "mysql+pymysql": MYSQL,
}

#: SQLite settings a URL may carry (``sqlite:///jobs.db?synchronous=FULL&busy_timeout=10000``).
#: Pages of write-ahead log after which a commit checkpoints it (SQLite's own default is 1,000).
_SQLITE_CHECKPOINT_PAGES = 10_000
_SQLITE_SYNC = ("OFF", "NORMAL", "FULL", "EXTRA")


class SchemaMissingError(ConfigurationError):
    """The queue's tables are not there: run the migrations."""


@dataclass
class DatabaseUrl:
    """A parsed ``DATABASE_URL``: its dialect, where it points, and its options."""

    url: str
    dialect: str
    #: What error messages name: ``host:port/db`` or the SQLite file.
    where: str
    path: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigurationError(
                f"database URL {url!r} is not a URL; expected sqlite:///path, postgresql://... or mysql://..."
            )
        parts = urllib.parse.urlsplit(url)
        dialect = _SCHEMES.get(parts.scheme.lower())
        if dialect is None:
            raise ConfigurationError(
                f"database URL scheme {parts.scheme!r} is not supported; use sqlite:///path, postgresql://... "
                "or mysql://..."
            )
        options = dict(urllib.parse.parse_qsl(parts.query))
        if dialect == SQLITE:
            if parts.netloc:
                raise ConfigurationError(
                    f"SQLite URL {url!r} has a host; write sqlite:///relative/path or sqlite:////absolute/path"
                )
            path = parts.path[1:] if parts.path.startswith("/") else parts.path
            if not path:
                raise ConfigurationError(f"SQLite URL {url!r} names no file; write sqlite:///jobs.db")
            sync = options.get("synchronous", "NORMAL").upper()
            if sync not in _SQLITE_SYNC:
                raise ConfigurationError(
                    f"SQLite URL option synchronous={options['synchronous']!r} is not one of {', '.join(_SQLITE_SYNC)}"
                )
            for name in ("busy_timeout", "wal_autocheckpoint"):
                if name in options and not options[name].isdigit():
                    raise ConfigurationError(
                        f"SQLite URL option {name}={options[name]!r} must be a whole number "
                        f"({'milliseconds' if name == 'busy_timeout' else 'pages'})"
                    )
            return cls(url=url, dialect=dialect, where=path, path=path, options=options)
        host = parts.hostname or "localhost"
        port = parts.port or (5432 if dialect == POSTGRESQL else 3306)
        database = parts.path.lstrip("/")
        return cls(url=url, dialect=dialect, where=f"{host}:{port}/{database}", options=options)

    @property
    def redacted(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


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


def connect(target: DatabaseUrl, *, application_name: str = "rainier_sync", init: tuple[str, ...] = ()) -> Any:
    """Open one connection in autocommit mode (the driver opens its own transactions),
    then run the ``init`` statements on it."""
    conn = _open(target, application_name)
    if init:
        cursor = conn.cursor()
        for statement in init:
            cursor.execute(statement)
    return conn


#: libpq TCP keepalives: a dead peer is noticed in about a minute (30 s idle, then 3 probes 10 s apart).
_PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def _open(target: DatabaseUrl, application_name: str) -> Any:
    opts = target.options
    if target.dialect == SQLITE:
        directory = os.path.dirname(os.path.abspath(target.path))
        if target.path != ":memory:" and not os.path.isdir(directory):
            raise ConfigurationError(f"SQLite database {target.path!r}: directory {directory!r} does not exist")
        busy_ms = int(opts.get("busy_timeout", "10000"))
        try:
            conn = sqlite3.connect(target.path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={opts.get('synchronous', 'NORMAL').upper()}")
            conn.execute(f"PRAGMA busy_timeout={busy_ms}")
            # A queue's table churns: every job is inserted, updated and deleted. Fewer,
            # larger checkpoints (each syncs the log and the file) cost its writers less.
            conn.execute(f"PRAGMA wal_autocheckpoint={int(opts.get('wal_autocheckpoint', _SQLITE_CHECKPOINT_PAGES))}")
        except sqlite3.Error as exc:
            raise ConfigurationError(f"cannot open SQLite database {target.path!r}: {exc}") from exc
        return conn
    if target.dialect == POSTGRESQL:
        psycopg = _import_psycopg()
        url = target.url
        scheme, rest = url.split("://", 1)
        if scheme != "postgresql":
            url = "postgresql://" + rest
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in opts:
            kwargs["connect_timeout"] = 5
        if "application_name" not in opts:
            kwargs["application_name"] = application_name
        # A peer that vanished without closing (a half-open TCP connection) would
        # otherwise hang a claim for as long as the kernel's own keepalive: hours.
        for key, value in _PG_KEEPALIVES.items():
            if key not in opts:
                kwargs[key] = value
        try:
            return psycopg.connect(url, **kwargs)
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigurationError(f"cannot connect to PostgreSQL at {target.where}: {first}") from exc
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
            connect_timeout=int(opts.get("connect_timeout", "5")),
            read_timeout=int(opts["read_timeout"]) if "read_timeout" in opts else None,
        )
    except pymysql.err.OperationalError as exc:
        raise ConfigurationError(f"cannot connect to MySQL/MariaDB at {target.where}: {exc.args[-1]}") from exc


class Database:
    """One connection shared by the threads of a process, behind a lock.

    A lost connection (server restart, ``pg_terminate_backend``, a proxy that
    dropped it) is opened again with an exponential backoff, and the operation
    that met the loss is retried once on the new connection; every operation
    the driver runs this way is safe to repeat.
    """

    def __init__(
        self,
        target: DatabaseUrl,
        *,
        reconnect_for: float = 30.0,
        application_name: str = "rainier_sync",
        init: tuple[str, ...] = (),
    ) -> None:
        self.target = target
        self.dialect = target.dialect
        self.reconnect_for = reconnect_for
        self.application_name = application_name
        self.init = init
        self.lock = threading.RLock()
        self._lost = connection_errors(self.dialect)
        self._conn: Any = connect(target, application_name=application_name, init=init)
        self._pid = os.getpid()
        self._orphans: list[Any] = []

    @property
    def connection(self) -> Any:
        """The live connection (reopened after a fork or a loss). Hold :attr:`lock`."""
        if self._pid != os.getpid():
            # A forked child must not close (and so terminate) its parent's session.
            self._orphans.append(self._conn)
            self._conn = None
            self._pid = os.getpid()
        if self._conn is None:
            self._reconnect()
        return self._conn

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

    def _reconnect(self) -> None:
        self._drop()
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.reconnect_for),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            retry=tenacity.retry_if_exception_type(ConfigurationError),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                self._conn = connect(self.target, application_name=self.application_name, init=self.init)
        log.info("reconnected to the %s database at %s", self.dialect, self.target.where)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is already gone
                pass

    def run(self, fn: Callable[[Any], T]) -> T:
        """``fn(connection)`` under the lock; reconnect and retry once if the connection was lost."""
        with self.lock:
            try:
                return fn(self.connection)
            except Exception as exc:
                if self.is_lost(exc):
                    log.warning("lost the %s connection to %s (%s); reconnecting", self.dialect, self.target.where, exc)
                    self._reconnect()
                    return fn(self.connection)
                raise

    def close(self) -> None:
        with self.lock:
            if self._pid == os.getpid():
                self._drop()
            self._conn = None
