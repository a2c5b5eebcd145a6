"""The contract suite against a Redis Cluster of three masters the tests start
(``tests/services/redis_topologies.py``), with freezegun driving the clock.

Each queue's keys carry its name as a hash tag, so the suite's queues spread
over the three nodes, and every script runs in one slot.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest
from freezegun import freeze_time

from .harness import Harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    url = request.getfixturevalue("redis_cluster_url")
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
                name="redis_cluster",
                make=make,
                reservation=30,
                advance=lambda seconds: frozen.tick(seconds),
            )
    finally:
        if made:
            client = made[0].client
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            for key in keys:
                client.delete(key)
            client.close()
