"""The store's protocols: the combined one is every small one, under both its names; the
public names load from where each store lives; one hint says what to give."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rainier_sync import QueueManager
from rainier_sync.drivers.memory import MemoryQueue
from rainier_sync.errors import CapabilityError, ConfigurationError
from rainier_sync.middleware import RateLimited
from rainier_sync.state import STORE_HINT, Counters, Locks, LockStore, StateStore, Tallies, Values, Windows

PARTS = {
    Locks: {"acquire", "release", "renew", "owner", "acquire_many", "renew_many"},
    Windows: {"take", "take_many"},
    Counters: {"count", "counted", "reset", "set_flag", "flags"},
    Values: {"put_value", "get_value", "wait_value"},
    Tallies: {"tally_add", "tally_settle", "tally_settle_many", "tally_unsettle", "tally"},
}


def _methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}


def test_the_combined_protocol_is_every_small_one_and_lockstore_is_its_other_name() -> None:
    assert LockStore is StateStore
    for part, methods in PARTS.items():
        assert issubclass(StateStore, part)
        assert _methods(part) == methods, part.__name__
    assert _methods(StateStore) == {"prune", "close"}


def test_a_store_with_locks_alone_refuses_the_rest_by_name() -> None:
    class OnlyLocks(StateStore):
        def acquire(self, key: str, owner: str, ttl: float) -> bool:
            return True

        def release(self, key: str, owner: str) -> bool:
            return True

        def renew(self, key: str, owner: str, ttl: float) -> bool:
            return True

        def owner(self, key: str) -> str | None:
            return None

    store = OnlyLocks()
    assert store.acquire_many([("a", "o"), ("b", "o")], 1.0) == [True, True]
    with pytest.raises(CapabilityError, match="OnlyLocks cannot count events"):
        store.count("k", 1.0)
    with pytest.raises(CapabilityError, match="OnlyLocks cannot keep tallies"):
        store.tally("k")
    with pytest.raises(TypeError):
        type("NoLocks", (StateStore,), {})()


def test_the_public_names_load_from_where_each_store_lives_without_its_client() -> None:
    code = (
        "import sys, rainier_sync.locks as locks\n"
        "assert not any(m.split('.')[0] in {'redis', 'psycopg', 'pymysql'} for m in sys.modules)\n"
        "from rainier_sync.drivers.database.store import DatabaseLockStore\n"
        "from rainier_sync.drivers.redis.store import RedisLockStore, lock_prefix\n"
        "from rainier_sync.state import MemoryLockStore, LockStore\n"
        "assert locks.MemoryLockStore is MemoryLockStore and locks.LockStore is LockStore\n"
        "assert locks.DatabaseLockStore is DatabaseLockStore and locks.RedisLockStore is RedisLockStore\n"
        "assert locks.lock_prefix is lock_prefix\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_memory_manager_over_one_queue_shares_its_store() -> None:
    queue = MemoryQueue()
    first, second = QueueManager({"m": queue}), QueueManager({"m": queue})
    assert first.locks is not None and first.locks is second.locks is queue.lock_store()
    assert QueueManager({"m": MemoryQueue()}).locks is not first.locks


def test_a_missing_store_says_the_one_hint() -> None:
    manager = QueueManager({"m": MemoryQueue()}, locks=None)
    with pytest.raises(ConfigurationError) as raised:
        manager.pause("mail")
    assert STORE_HINT in str(raised.value)
    with pytest.raises(ConfigurationError) as raised:
        RateLimited("api", 1, 1.0)._locks()
    assert STORE_HINT in str(raised.value)
