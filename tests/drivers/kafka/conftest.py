"""Per-test names (group, topic prefix, lock keys) and a shared Redis lock store."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest


@pytest.fixture
def names() -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    return {"group": f"t-{tag}", "prefix": f"t-{tag}.", "locks": f"rainier-test:kafka:{tag}:"}


@pytest.fixture
def shared_locks(redis_url: str, names: dict[str, str]) -> Iterator[object]:
    """A RedisLockStore under a unique key prefix; its keys are deleted afterwards."""
    from rainier_sync.locks import RedisLockStore

    store = RedisLockStore.from_url(redis_url, prefix=names["locks"])
    try:
        store._client.ping()
    except Exception:  # noqa: BLE001
        from tests.support import missing_service

        missing_service("Redis on 127.0.0.1:6379", "redis-server --daemonize yes --bind 127.0.0.1 --port 6379")
    yield store
    keys = list(store._client.scan_iter(match=names["locks"] + "*", count=1000))
    if keys:
        store._client.delete(*keys)
    store.close()

