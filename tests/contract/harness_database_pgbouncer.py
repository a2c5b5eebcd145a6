"""The contract through a pgbouncer in transaction mode (``listen=false``)."""

from __future__ import annotations

from typing import Iterator

import pytest
from freezegun import freeze_time

from rainier_sync.drivers.database import DatabaseQueue
from tests.drivers.database.support import pgbouncer_url

from .harness import Harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    url = pgbouncer_url(request)

    def make() -> DatabaseQueue:
        queue = DatabaseQueue.from_url(url, reservation=30, poll_interval=0.05)
        queue._backend.execute("TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks")
        return queue

    with freeze_time("2026-03-01 12:00:00") as frozen:
        yield Harness(
            name="database_pgbouncer",
            make=make,
            reservation=30,
            advance=lambda seconds: frozen.tick(seconds),
        )
