"""Database URLs: the dialect a URL names, where it points, and its options."""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass, field

from ...errors import ConfigurationError

SQLITE, POSTGRESQL, MYSQL = "sqlite", "postgresql", "mysql"
DIALECTS = (SQLITE, POSTGRESQL, MYSQL)
_NAMES = {SQLITE: "SQLite", POSTGRESQL: "PostgreSQL", MYSQL: "MySQL/MariaDB"}

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
_SQLITE_SYNC = ("OFF", "NORMAL", "FULL", "EXTRA")

#: Seconds a lost connection is reopened for before an operation gives up.
RECONNECT_FOR = 10.0
#: Seconds a statement waits for the server's reply before the connection counts as lost.
RESPONSE_TIMEOUT = 10.0
#: Seconds each attempt to open a connection may take (PostgreSQL and MariaDB/MySQL).
CONNECT_TIMEOUT = 5
#: The driver's own URL options: taken out before the URL reaches the client library.
_OWN_OPTIONS = ("reconnect_for", "response_timeout", "listen")
_FLAGS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _seconds(name: str, value: str, *, allow_zero: bool) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigurationError(
            f"database URL option {name}={value!r} must be a number of seconds{'' if allow_zero else ' above 0'}"
        )
    return seconds


@dataclass
class DatabaseUrl:
    """A parsed ``DATABASE_URL``: its dialect, where it points, and its options."""

    url: str
    dialect: str
    #: What error messages name: ``host:port/db`` or the SQLite file.
    where: str
    path: str = ""
    #: Options for the dialect's client (the driver's own are taken out).
    options: dict[str, str] = field(default_factory=dict)
    reconnect_for: float | None = None
    response_timeout: float | None = None
    #: False behind a transaction-pooling proxy (pgbouncer): no ``LISTEN`` and no
    #: server-side prepared statements, which need a session of their own.
    listen: bool = True

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
        query = urllib.parse.parse_qsl(parts.query)
        options = dict(query)
        reconnect_for = response_timeout = None
        if "reconnect_for" in options:
            reconnect_for = _seconds("reconnect_for", options.pop("reconnect_for"), allow_zero=True)
        if "response_timeout" in options:
            response_timeout = _seconds("response_timeout", options.pop("response_timeout"), allow_zero=False)
        listen = True
        if "listen" in options:
            written = options.pop("listen")
            if written.strip().lower() not in _FLAGS:
                raise ConfigurationError(f"database URL option listen={written!r} must be true or false")
            listen = _FLAGS[written.strip().lower()]
        if len(options) < len(query):
            kept = [(key, value) for key, value in query if key not in _OWN_OPTIONS]
            url = urllib.parse.urlunsplit(
                parts._replace(query=urllib.parse.urlencode(kept, quote_via=urllib.parse.quote))
            )
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
            return cls(url, dialect, path, path, options, reconnect_for, response_timeout, listen)
        for name in ("connect_timeout", "read_timeout", "write_timeout"):
            if name in options and not options[name].isdigit():
                raise ConfigurationError(
                    f"database URL option {name}={options[name]!r} must be a whole number of seconds"
                )
        host = parts.hostname or "localhost"
        port = parts.port or (5432 if dialect == POSTGRESQL else 3306)
        database = parts.path.lstrip("/")
        return cls(url, dialect, f"{host}:{port}/{database}", "", options, reconnect_for, response_timeout, listen)

    @property
    def redacted(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    @property
    def label(self) -> str:
        """``the PostgreSQL database at host:port/db``: how messages name it."""
        if self.dialect == SQLITE:
            return f"the SQLite database {self.where}"
        return f"the {_NAMES[self.dialect]} database at {self.where}"

    @property
    def connect_timeout(self) -> float:
        if self.dialect == SQLITE:
            return 0.0
        return float(self.options.get("connect_timeout", CONNECT_TIMEOUT))
