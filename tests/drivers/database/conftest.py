from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from rainier_sync.drivers.database import DatabaseQueue

from .support import emptied, mysql_database_url, postgres_schema_url

_TABLES = ("rainier_jobs", "rainier_failed_jobs", "rainier_locks")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    queue.close()
    return url


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    return emptied(postgres_schema_url(request), *_TABLES)


@pytest.fixture
def my_url(request: pytest.FixtureRequest) -> str:
    return emptied(mysql_database_url(request), *_TABLES)


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated, empty database of each dialect."""
    name = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "my_url"}[request.param]
    return str(request.getfixturevalue(name))


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    out = tmp_path / "runs"
    out.mkdir()
    monkeypatch.setenv("RAINIER_TEST_OUT", str(out))
    yield out
