"""The contract suite against a Redis Cluster of three masters the tests start
(``tests/services/redis_topologies.py``), with freezegun driving the clock.

Each queue's keys carry its name as a hash tag, so the suite's queues spread
over the three nodes, and every script runs in one slot.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from .harness import Harness
from .harness_redis import redis_harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from redis_harness(request, "redis_cluster_url", "redis_cluster")
