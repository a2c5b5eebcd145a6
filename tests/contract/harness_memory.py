from __future__ import annotations

from typing import Iterator

import pytest
from freezegun import freeze_time

from rainier_sync.drivers import MemoryQueue

from .harness import Harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    with freeze_time("2026-03-01 12:00:00") as frozen:
        yield Harness(
            name="memory",
            make=lambda: MemoryQueue(reservation=30),
            reservation=30,
            advance=lambda seconds: frozen.tick(seconds),
        )
