"""Per-session isolation on the real servers: a fresh PostgreSQL schema and a
fresh MariaDB database, migrated once, dropped when the session ends."""

from __future__ import annotations

import os
import urllib.parse
import uuid

import pytest

from rainier_sync.drivers.database import DatabaseQueue

_made: dict[str, str] = {}


def with_search_path(url: str, schema: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-c search_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query, quote_via=urllib.parse.quote)))


def postgres_schema_url(request: pytest.FixtureRequest) -> str:
    """The PostgreSQL URL of a schema this test session owns, migrated."""
    if "postgresql" in _made:
        return _made["postgresql"]
    import psycopg

    base: str = request.getfixturevalue("postgres_url")
    schema = f"rainier_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    request.config.add_cleanup(drop)
    url = with_search_path(base, schema)
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    queue.close()
    _made["postgresql"] = url
    return url


def mysql_database_url(request: pytest.FixtureRequest) -> str:
    """The MariaDB URL of a database this test session owns, migrated."""
    if "mysql" in _made:
        return _made["mysql"]
    import pymysql

    base: str = request.getfixturevalue("mysql_url")
    parts = urllib.parse.urlsplit(base)
    name = f"rainier_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    def server() -> pymysql.connections.Connection:  # type: ignore[type-arg]
        return pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            autocommit=True,
        )

    with server() as conn, conn.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE `{name}`")

    def drop() -> None:
        with server() as conn, conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")

    request.config.add_cleanup(drop)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    queue.close()
    _made["mysql"] = url
    return url
