"""The contract suite against the real Redis, with freezegun driving the clock.

Every due time and reservation deadline the driver uses comes from the Python
clock, so a freezegun tick moves them without waiting on the server.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest
from freezegun import freeze_time

from .harness import Harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from redis_harness(request, "redis_url", "redis")


def redis_harness(request: pytest.FixtureRequest, url_fixture: str, name: str) -> Iterator[Harness]:
    """The suite on the Redis that ``url_fixture`` names, its keys under a prefix of
    its own, removed one by one at the end (a Cluster refuses a DEL across slots)."""
    url = request.getfixturevalue(url_fixture)
    from rainier_sync.drivers import RedisQueue

    prefix = f"rscontract:{uuid.uuid4().hex[:12]}:"
    made: list[RedisQueue] = []

    def make() -> RedisQueue:
        queue = RedisQueue.from_url(url, prefix=prefix, reservation=30)
        made.append(queue)
        return queue

    try:
        with freeze_time("2026-03-01 12:00:00") as frozen:
            yield Harness(
                name=name,
                make=make,
                reservation=30,
                advance=lambda seconds: frozen.tick(seconds),
            )
    finally:
        if made:
            client = made[0].client
            for key in list(client.scan_iter(match=prefix + "*", count=1000)):
                client.delete(key)
            client.close()
