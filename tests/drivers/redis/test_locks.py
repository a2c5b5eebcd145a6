"""The Redis lock store against the real server."""

from __future__ import annotations

import threading

import pytest

from rainier_sync.errors import ConfigurationError
from rainier_sync.locks import RedisLockStore
from tests.support import wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_url: str, prefix: str) -> RedisLockStore:
    return RedisLockStore.from_url(redis_url, prefix=prefix + "lock:")


def test_only_one_owner_at_a_time(store: RedisLockStore) -> None:
    assert store.acquire("job:1", "alice", 30)
    assert not store.acquire("job:1", "bob", 30)
    assert store.owner("job:1") == "alice"


def test_release_and_renew_only_by_the_owner(store: RedisLockStore) -> None:
    store.acquire("job:1", "alice", 30)
    assert not store.release("job:1", "bob")
    assert not store.renew("job:1", "bob", 30)
    assert store.owner("job:1") == "alice"
    assert store.renew("job:1", "alice", 60)
    assert store.release("job:1", "alice")
    assert store.owner("job:1") is None
    assert store.acquire("job:1", "bob", 30)


def test_a_lock_expires_and_the_old_owner_cannot_release_the_new_one(store: RedisLockStore, redis_client) -> None:
    store.acquire("job:1", "alice", 0.05)
    # PX is Redis's clock, not the Python one: wait for the key to go.
    wait_until(lambda: store.owner("job:1") is None, timeout=5, message="the lock to expire")
    assert store.acquire("job:1", "bob", 30)
    assert not store.release("job:1", "alice")
    assert not store.renew("job:1", "alice", 30)
    assert store.owner("job:1") == "bob"


def test_concurrent_acquire_has_exactly_one_winner(store: RedisLockStore) -> None:
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def contend(name: str) -> None:
        barrier.wait()
        if store.acquire("hot", name, 30):
            winners.append(name)

    threads = [threading.Thread(target=contend, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(winners) == 1
    assert store.owner("hot") == winners[0]


def test_bad_ttl_and_bad_url_are_refused(store: RedisLockStore) -> None:
    with pytest.raises(ValueError, match="job:1"):
        store.acquire("job:1", "alice", 0)
    with pytest.raises(ConfigurationError, match="http://x"):
        RedisLockStore.from_url("http://x")


def test_keys_live_under_the_prefix(store: RedisLockStore, redis_client, prefix: str) -> None:
    store.acquire("job:1", "alice", 30)
    assert redis_client.get(prefix + "lock:job:1") == b"alice"


def test_many_locks_are_taken_and_renewed_in_one_call(redis_url: str) -> None:
    import uuid

    from rainier_sync.locks import RedisLockStore

    prefix = f"test:locks-many:{uuid.uuid4().hex}:"
    store = RedisLockStore.from_url(redis_url, prefix=prefix)
    try:
        assert store.acquire("b", "other", 30)
        assert store.acquire_many([("a", "me"), ("b", "me"), ("c", "me")], 30) == [True, False, True]
        assert store.renew_many([("a", "me"), ("b", "me"), ("c", "someone")], 60) == [True, False, False]
        assert store.owner("a") == "me" and store.owner("b") == "other"
        assert store.acquire_many([], 30) == [] and store.renew_many([], 30) == []
    finally:
        for key in ("a", "b", "c"):
            store._client.delete(prefix + key)
        store.close()
