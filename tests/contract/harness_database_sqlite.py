from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

import pytest
from freezegun import freeze_time

from rainier_sync.drivers.database import DatabaseQueue

from .harness import Harness

_files = itertools.count()


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    tmp: Path = request.getfixturevalue("tmp_path")

    def make() -> DatabaseQueue:
        queue = DatabaseQueue.from_url(f"sqlite:///{tmp / f'jobs-{next(_files)}.db'}", reservation=30)
        queue.migrate()
        return queue

    with freeze_time("2026-03-01 12:00:00") as frozen:
        yield Harness(
            name="database_sqlite",
            make=make,
            reservation=30,
            advance=lambda seconds: frozen.tick(seconds),
        )
