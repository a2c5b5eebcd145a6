"""Fixtures for the servers this machine runs: PostgreSQL, MariaDB, Redis.

Each fixture checks the server answers where its URL points; under ``CI=true``
a missing one fails the test, elsewhere it skips saying how to start it.
Override the URLs with ``TEST_POSTGRES_URL``, ``TEST_MYSQL_URL`` and
``TEST_REDIS_URL``.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.support import missing_service, port_open

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
MYSQL_URL = os.environ.get("TEST_MYSQL_URL", DEFAULT_MYSQL_URL)
REDIS_URL = os.environ.get("TEST_REDIS_URL", DEFAULT_REDIS_URL)

#: Per URL scheme: the server's name, its default port, and how to start it here.
_SERVERS = {
    "postgresql": ("PostgreSQL", 5432, "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"),
    "mysql": ("MariaDB", 3306, "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"),
    "redis": ("Redis", 6379, "redis-server --daemonize yes --bind 127.0.0.1 --port {port} --save '' --appendonly no"),
}


def require(url: str) -> str:
    """``url``, once its server answers on the host and port the URL names."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    what, default_port, how_to_start = _SERVERS[{"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)]
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    if not port_open(host, port):
        missing_service(f"{what} on {host}:{port}", how_to_start.format(port=port))
    return url


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return require(POSTGRES_URL)


@pytest.fixture(scope="session")
def mysql_url() -> str:
    return require(MYSQL_URL)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return require(REDIS_URL)
