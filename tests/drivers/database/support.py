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


#: Where Debian puts pgbouncer; also looked for on PATH.
_PGBOUNCER = ("pgbouncer", "/usr/sbin/pgbouncer")


def pgbouncer_url(request: pytest.FixtureRequest) -> str:
    """A URL (``listen=false``) of a database this test session owns, migrated,
    reached through a pgbouncer in transaction mode that this session started
    on a free loopback port. Skips (fails under ``CI=true``) without pgbouncer."""
    if "pgbouncer" in _made:
        return _made["pgbouncer"]
    import shutil
    import subprocess

    import psycopg

    from tests.support import free_port, missing_service, port_open, wait_until

    binary = next((found for name in _PGBOUNCER if (found := shutil.which(name))), None)
    if binary is None:
        missing_service("pgbouncer", "apt-get install -y pgbouncer (or run .ci/services.sh)")
    base: str = request.getfixturevalue("postgres_url")
    server = urllib.parse.urlsplit(base)
    # A database of its own: pgbouncer drops a connection's search_path option.
    name = f"rainier_pgb_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("pgbouncer")
    port = free_port()
    user = server.username or "postgres"
    (tmp / "users.txt").write_text(f'"{user}" ""\n')
    (tmp / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.hostname or '127.0.0.1'} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {tmp / 'users.txt'}\n"
        "pool_mode = transaction\n"
        # Few server connections, so one client's transactions move between them.
        "default_pool_size = 3\n"
        "max_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    # pgbouncer will not run as root; it reads its files before it changes user.
    command = [binary, *(["-u", "nobody"] if os.geteuid() == 0 else []), str(tmp / "pgbouncer.ini")]
    log = (tmp / "pgbouncer.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    request.config.add_cleanup(stop)
    wait_until(
        lambda: process.poll() is not None or port_open("127.0.0.1", port),
        timeout=10,
        message="pgbouncer to listen",
    )
    if process.poll() is not None:
        raise RuntimeError(f"pgbouncer exited: {(tmp / 'pgbouncer.log').read_text()}")
    url = f"postgresql://{user}@127.0.0.1:{port}/{name}?listen=false"
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    queue.close()
    _made["pgbouncer"] = url
    return url


def emptied(url: str, *tables: str) -> str:
    """``url``, after removing every row of ``tables`` in its (migrated) database."""
    queue = DatabaseQueue.from_url(url)
    try:
        for table in tables:
            queue._backend.execute(f"DELETE FROM {table}")
    finally:
        queue.close()
    return url
