"""The DBAPI connection under a SQLAlchemy ``Connection`` or ``Session``, for
``within(...)``. SQLAlchemy is imported only when such an object is given."""

from __future__ import annotations

from typing import Any

from ...errors import DriverUnavailableError
from .url import MYSQL, POSTGRESQL, SQLITE

#: SQLAlchemy's dialect names, and the driver of each whose connections the queue can write on.
_DIALECTS = {"sqlite": SQLITE, "postgresql": POSTGRESQL, "mysql": MYSQL, "mariadb": MYSQL}
_DRIVERS = {
    SQLITE: ("pysqlite", "sqlite"),
    POSTGRESQL: ("psycopg", "postgresql+psycopg"),
    MYSQL: ("pymysql", "mysql+pymysql"),
}


def is_sqlalchemy(obj: Any) -> bool:
    """Whether ``obj`` is one of SQLAlchemy's own (or a subclass), without importing it."""
    return any(cls.__module__.split(".")[0] == "sqlalchemy" for cls in type(obj).__mro__)


def dbapi_connection(obj: Any) -> tuple[Any, str, str]:
    """The driver's connection under ``obj`` (a ``Connection``, a ``Session`` or a
    ``scoped_session``) with a transaction begun on it, its dialect, and how
    messages name it. Raises ``TypeError`` for any other SQLAlchemy object and
    for a driver the queue cannot write on (psycopg2, mysqlclient)."""
    try:
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session, scoped_session
    except ImportError:  # pragma: no cover - depends on the environment
        raise DriverUnavailableError(
            "dispatch within a SQLAlchemy transaction needs SQLAlchemy 2: pip install 'rainier_sync[sqlalchemy]'"
        ) from None
    if isinstance(obj, (Session, scoped_session)):
        # Begins the session's transaction (if it has none yet) on the connection it will commit.
        conn = obj.connection()
        kind = "Session"
    elif isinstance(obj, Connection):
        conn = obj
        if not conn.in_transaction():
            # What the next statement would do anyway; without it the job would
            # be outside the transaction the caller's commit() commits.
            conn.begin()
        kind = "Connection"
    else:
        raise TypeError(
            f"dispatch within a transaction takes a SQLAlchemy Connection or Session, got {type(obj).__qualname__}"
        )
    name, driver = conn.dialect.name, conn.dialect.driver
    described = f"a SQLAlchemy {kind} on {name}+{driver}"
    dialect = _DIALECTS.get(name, "")
    wanted = _DRIVERS.get(dialect)
    if wanted is None or driver != wanted[0]:
        hint = f"; use a {wanted[1]}:// URL" if wanted else ""
        raise TypeError(
            f"dispatch within a transaction: {described} cannot carry a job (the queue writes with "
            f"sqlite3, psycopg 3 or PyMySQL){hint}"
        )
    return conn.connection.driver_connection, dialect, described
