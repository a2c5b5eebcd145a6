"""Databases of this test session's own on the real servers, and Django settings over them."""

from __future__ import annotations

import os
import urllib.parse
import uuid
from typing import Any

import pytest

_made: dict[tuple[str, str], dict[str, Any]] = {}


def postgres_database(request: pytest.FixtureRequest, purpose: str = "site") -> dict[str, Any]:
    """A ``DATABASES`` entry for a PostgreSQL database this session created for ``purpose`` (dropped at its end)."""
    if ("postgresql", purpose) in _made:
        return dict(_made["postgresql", purpose])
    import psycopg

    base: str = request.getfixturevalue("postgres_url")
    parts = urllib.parse.urlsplit(base)
    name = f"rainier_dj_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    request.config.add_cleanup(drop)
    entry = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        "USER": parts.username or "postgres",
        "PASSWORD": parts.password or "",
    }
    _made["postgresql", purpose] = entry
    return dict(entry)


def mysql_database(request: pytest.FixtureRequest, purpose: str = "site") -> dict[str, Any]:
    """A ``DATABASES`` entry for a MariaDB database this session created for ``purpose`` (dropped at its end)."""
    if ("mysql", purpose) in _made:
        return dict(_made["mysql", purpose])
    import pymysql

    base: str = request.getfixturevalue("mysql_url")
    parts = urllib.parse.urlsplit(base)
    name = f"rainier_dj_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    server = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
    }
    with pymysql.connect(**server, autocommit=True) as conn, conn.cursor() as cursor:  # type: ignore[arg-type]
        cursor.execute(f"CREATE DATABASE `{name}`")

    def drop() -> None:
        with pymysql.connect(**server, autocommit=True) as conn, conn.cursor() as cursor:  # type: ignore[arg-type]
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")

    request.config.add_cleanup(drop)
    entry = {
        "ENGINE": "django.db.backends.mysql",
        "NAME": name,
        "HOST": server["host"],
        "PORT": str(server["port"]),
        "USER": server["user"],
        "PASSWORD": server["password"],
    }
    _made["mysql", purpose] = entry
    return dict(entry)


def use_pymysql() -> None:
    """Django's MySQL backend speaks through MySQLdb: let PyMySQL stand in for it."""
    import pymysql

    pymysql.version_info = (2, 2, 1, "final", 0)
    pymysql.install_as_MySQLdb()
