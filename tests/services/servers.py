"""Fixtures for the servers this machine runs: PostgreSQL, MariaDB, Redis.

Each fixture checks the server answers; under ``CI=true`` a missing one
fails the test, elsewhere it skips saying how to start it. Override the
addresses with ``TEST_POSTGRES_URL``, ``TEST_MYSQL_URL`` and ``TEST_REDIS_URL``.
"""

from __future__ import annotations

import os

import pytest

from tests.support import missing_service, port_open

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    if not port_open("127.0.0.1", 5432):
        missing_service(
            "PostgreSQL on 127.0.0.1:5432", "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
        )
    return POSTGRES_URL


@pytest.fixture(scope="session")
def mysql_url() -> str:
    if not port_open("127.0.0.1", 3306):
        missing_service(
            "MariaDB on 127.0.0.1:3306", "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"
        )
    return MYSQL_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    if not port_open("127.0.0.1", 6379):
        missing_service(
            "Redis on 127.0.0.1:6379",
            "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no",
        )
    return REDIS_URL
