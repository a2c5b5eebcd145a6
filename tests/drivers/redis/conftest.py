"""Fixtures for the Redis driver's tests: a unique key prefix per test, cleaned up after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

redis = pytest.importorskip("redis")


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()
    except redis.ConnectionError as error:  # pragma: no cover - server went away after the port check
        pytest.fail(f"Redis at {redis_url} does not answer: {error}")
    yield client
    client.close()


@pytest.fixture
def prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted afterwards."""
    value = f"rstest:{uuid.uuid4().hex[:12]}:"
    yield value
    keys = list(redis_client.scan_iter(match=value + "*", count=1000))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def proxy(redis_url: str) -> Iterator[object]:
    """A TCP proxy of the test's own in front of the real Redis (tests/drivers/redis/proxy.py)."""
    from .proxy import Proxy

    made = Proxy(redis_url)
    yield made
    made.close()
