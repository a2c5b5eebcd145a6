from __future__ import annotations

from typing import Iterator

import pytest
from freezegun import freeze_time

from rainier_sync.drivers.database import DatabaseQueue
from tests.drivers.database.support import mysql_database_url

from .harness import Harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    url = mysql_database_url(request)

    def make() -> DatabaseQueue:
        queue = DatabaseQueue.from_url(url, reservation=30)
        for table in ("rainier_jobs", "rainier_failed_jobs", "rainier_locks"):
            queue._backend.execute(f"DELETE FROM {table}")
        return queue

    with freeze_time("2026-03-01 12:00:00") as frozen:
        yield Harness(
            name="database_mysql",
            make=make,
            reservation=30,
            advance=lambda seconds: frozen.tick(seconds),
        )
