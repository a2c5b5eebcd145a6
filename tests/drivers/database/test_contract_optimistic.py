"""The whole contract suite again on PostgreSQL's portable claim path
(``claim="optimistic"``), so both claim paths give the same guarantees."""

from __future__ import annotations

from typing import Iterator

import pytest
from freezegun import freeze_time

from rainier_sync.drivers.base import BaseQueue
from rainier_sync.drivers.database import DatabaseQueue
from tests.contract import test_contract
from tests.contract.harness import Harness

from .support import postgres_schema_url

globals().update({name: getattr(test_contract, name) for name in dir(test_contract) if name.startswith("test_")})


@pytest.fixture
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    url = postgres_schema_url(request)

    def make() -> DatabaseQueue:
        queue = DatabaseQueue.from_url(url, reservation=30, claim="optimistic")
        queue._backend.execute("TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks")
        return queue

    with freeze_time("2026-03-01 12:00:00") as frozen:
        yield Harness(name="postgres_optimistic", make=make, reservation=30, advance=lambda s: frozen.tick(s))


@pytest.fixture
def q(h: Harness) -> Iterator[BaseQueue]:
    driver = h.make()
    try:
        yield driver
    finally:
        driver.close()
