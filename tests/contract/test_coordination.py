"""The lock store's coordination API (job middleware's windows and counters,
paused queues' flags), held alike on every store: memory, the database on
SQLite, PostgreSQL and MariaDB, and Redis (one server, and a Redis Cluster),
each against its real server."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from freezegun import freeze_time

from rainier_sync import Job, JobContext
from rainier_sync.locks import LockStore, MemoryLockStore

STORES = ["memory", "sqlite", "postgres", "mysql", "redis", "redis_cluster"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LockStore]:
    kind = request.param
    if kind == "memory":
        yield MemoryLockStore()
        return
    if kind in ("redis", "redis_cluster"):
        from rainier_sync.locks import RedisLockStore

        url = request.getfixturevalue("redis_url" if kind == "redis" else "redis_cluster_url")
        made: LockStore = RedisLockStore.from_url(url, prefix=f"rstest:{uuid.uuid4().hex[:12]}:")
    else:
        from rainier_sync.locks import DatabaseLockStore
        from tests.drivers.database.support import mysql_database_url, postgres_schema_url

        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'locks.db'}"
        elif kind == "postgres":
            url = postgres_schema_url(request)
        else:
            url = mysql_database_url(request)
        database = DatabaseLockStore.from_url(url)
        database.migrate()
        made = database
    yield made
    made.close()


def key() -> str:
    """A key no other test (or earlier run on the same server) has used."""
    return f"k-{uuid.uuid4().hex[:10]}"


def test_a_sliding_window_takes_up_to_its_limit_then_says_how_long_to_wait(store: LockStore) -> None:
    name = key()
    with freeze_time("2026-01-01 00:00:00") as clock:
        assert [store.take(name, 3, 10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
        assert store.take(name, 3, 10.0) == pytest.approx(10.0)
        clock.tick(4)
        assert store.take(name, 3, 10.0) == pytest.approx(6.0), "a refused take counts nothing"
        clock.tick(6)
        assert store.take(name, 3, 10.0) == 0.0, "the first three starts have left the window"
        assert store.take(name, 3, 10.0) == 0.0
        assert store.take(name, 3, 10.0) == 0.0
        assert store.take(name, 3, 10.0) == pytest.approx(10.0)
        assert store.take(key(), 3, 10.0) == 0.0, "each key has a window of its own"


def test_a_window_never_lets_more_than_its_limit_through_at_once(store: LockStore) -> None:
    name, taken = key(), []
    barrier = threading.Barrier(6)

    def contend() -> None:
        barrier.wait()
        for _ in range(5):
            if store.take(name, 7, 3600.0) == 0.0:
                taken.append(1)

    threads = [threading.Thread(target=contend) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(taken) == 7


def test_several_starts_are_taken_at_once_as_far_as_the_window_has_room(store: LockStore) -> None:
    name = key()
    with freeze_time("2026-01-01 00:00:00") as clock:
        assert store.take_many(name, 4, 10, 10.0) == (4, [])
        assert store.take_many(name, 4, 10, 10.0, hold=0.5) == (4, [])
        taken, rooms = store.take_many(name, 4, 10, 10.0)
        assert taken == 2, "only what the window has room for"
        assert rooms == pytest.approx([10.0] * 6 + [10.5] * 4), "oldest first"
        assert store.take_many(name, 1, 10, 10.0) == (0, rooms), "a refused take counts nothing"
        assert store.take(name, 10, 10.0) == pytest.approx(10.0), "take and take_many share the window"
        clock.tick(10)
        taken, rooms = store.take_many(name, 9, 10, 10.0)
        assert taken == 6, "the starts at 0 have left; those held to 0.5 stay until 10.5"
        assert rooms == pytest.approx([0.5] * 4 + [10.0] * 6)
        clock.tick(0.5)
        assert store.take_many(name, 9, 10, 10.0)[0] == 4


def test_a_full_window_names_at_most_rooms_rooms(store: LockStore) -> None:
    from rainier_sync.state.base import ROOMS

    name = key()
    with freeze_time("2026-01-01 00:00:00"):
        assert store.take_many(name, 500, 500, 60.0) == (500, [60.0] * ROOMS)


def test_starts_taken_several_at_a_time_never_pass_the_limit(store: LockStore) -> None:
    name, taken = key(), []
    barrier = threading.Barrier(6)

    def contend(n: int) -> None:
        barrier.wait()
        for _ in range(5):
            taken.append(store.take_many(name, n, 23, 3600.0, hold=0.1)[0])

    threads = [threading.Thread(target=contend, args=(n,)) for n in (1, 2, 3, 4, 5, 6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sum(taken) == 23


@pytest.mark.parametrize("store", [kind for kind in STORES if kind != "memory"], indirect=True)
def test_a_window_kept_one_start_at_a_time_is_read_as_such(store: LockStore) -> None:
    """Windows written before starts were taken in batches (a start per member
    or per stamp) count as they did."""
    name = key()
    with freeze_time("2026-01-01 00:00:00") as clock:
        now = clock().timestamp()
        if type(store).__name__ == "RedisLockStore":
            client, prefix = store._client, store._prefix  # type: ignore[attr-defined]
            client.zadd(f"{prefix}window:{name}", {"a" * 32: now - 1, "b" * 32: now - 0.5})
        else:
            starts = f"{now - 20!r} {now - 1!r} {now - 0.5!r}"
            store._backend.execute(  # type: ignore[attr-defined]
                "INSERT INTO rainier_windows (window_key, starts) VALUES (%s, %s)", (name, starts)
            )
        assert store.take_many(name, 5, 4, 10.0) == (2, pytest.approx([9.0, 9.5, 10.0, 10.0]))


def test_a_count_grows_then_lapses_after_its_window(store: LockStore) -> None:
    name = key()
    with freeze_time("2026-01-01 00:00:00") as clock:
        assert store.counted(name) == (0, 0.0)
        assert [store.count(name, 60.0) for _ in range(3)] == [1, 2, 3]
        hits, lapses = store.counted(name)
        assert hits == 3 and lapses == pytest.approx(clock().timestamp() + 60.0)
        clock.tick(59)
        assert store.count(name, 60.0) == 4, "each event moves the lapse on"
        clock.tick(61)
        assert store.counted(name) == (0, 0.0)
        assert store.count(name, 60.0) == 1
        store.reset(name)
        assert store.counted(name) == (0, 0.0)


def test_counts_from_many_threads_are_all_counted(store: LockStore) -> None:
    name = key()

    def bump() -> None:
        for _ in range(10):
            store.count(name, 3600.0)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert store.counted(name)[0] == 40


def test_flags_are_raised_and_lowered_per_group(store: LockStore) -> None:
    group = key()
    assert store.flags(group) == set()
    store.set_flag(group, "mail", True)
    store.set_flag(group, "mail", True)
    store.set_flag(group, "reports", True)
    store.set_flag(key(), "other", True)
    assert store.flags(group) == {"mail", "reports"}
    store.set_flag(group, "mail", False)
    store.set_flag(group, "never-raised", False)
    assert store.flags(group) == {"reports"}


def test_a_value_is_kept_replaced_and_expires(store: LockStore) -> None:
    name = key()
    with freeze_time("2026-01-01 00:00:00") as clock:
        assert store.get_value(name) is None
        store.put_value(name, '{"status":"pending"}', 60)
        assert store.get_value(name) == '{"status":"pending"}'
        store.put_value(name, '{"status":"processed","value":"é ✓"}', 60)
        assert store.get_value(name) == '{"status":"processed","value":"é ✓"}'
        clock.tick(61)
        assert store.get_value(name) is None


def test_a_waiter_is_woken_when_the_value_is_put(store: LockStore) -> None:
    name = key()
    store.put_value(name, "pending", 60)
    assert store.wait_value(name, 0.05, lambda v: v != "pending") == "pending", "times out with the last value"
    putter = threading.Timer(0.2, store.put_value, args=(name, "done", 60))
    putter.start()
    assert store.wait_value(name, 10, lambda v: v != "pending") == "done"
    putter.join(10)  # the waiter can see the value before the putter has read its reply


def test_a_tally_counts_each_member_once(store: LockStore) -> None:
    name = key()
    assert store.tally(name) is None
    start = {"total": 3, "pending": 3, "processed": 0, "failed": 0}
    assert store.tally_add(name, start, 3600) == start
    counts, new = store.tally_settle(name, "job-1", "processed", 3600)
    assert new and counts == {"total": 3, "pending": 2, "processed": 1, "failed": 0}
    counts, new = store.tally_settle(name, "job-1", "processed", 3600)
    assert not new and counts["pending"] == 2 and counts["processed"] == 1, "a member settles once"
    counts, new = store.tally_settle(name, "job-2", "failed", 3600)
    assert new and (counts["pending"], counts["failed"]) == (1, 1)
    assert store.tally_add(name, {"total": 2, "pending": 2}, 3600)["pending"] == 3
    assert store.tally(name) == {"total": 5, "pending": 3, "processed": 1, "failed": 1}


def test_a_member_unsettled_goes_back_to_pending_once_and_settles_again(store: LockStore) -> None:
    name = key()
    store.tally_add(name, {"total": 2, "pending": 2, "processed": 0, "failed": 0}, 3600)
    store.tally_settle_many([(name, "job-1", "failed", 3600), (name, "job-2", "processed", 3600)])
    counts, there = store.tally_unsettle(name, "job-1", "failed", 3600)
    assert there and counts == {"total": 2, "pending": 1, "processed": 1, "failed": 0}
    counts, there = store.tally_unsettle(name, "job-1", "failed", 3600)
    assert not there and counts == {"total": 2, "pending": 1, "processed": 1, "failed": 0}, "once"
    assert not store.tally_unsettle(name, "job-9", "failed", 3600)[1], "never settled: nothing changes"
    counts, new = store.tally_settle(name, "job-1", "processed", 3600)
    assert new and counts == {"total": 2, "pending": 0, "processed": 2, "failed": 0}, "it counts again"
    assert store.tally(name) == counts


def test_a_member_unsettled_from_many_threads_at_once_goes_back_once(store: LockStore) -> None:
    name = key()
    store.tally_add(name, {"total": 10, "pending": 10, "processed": 0, "failed": 0}, 3600)
    store.tally_settle_many([(name, f"job-{n}", "failed", 3600) for n in range(10)])
    answers: list[bool] = []
    barrier = threading.Barrier(4)

    def unsettle() -> None:
        barrier.wait()
        for n in range(10):
            answers.append(store.tally_unsettle(name, f"job-{n}", "failed", 3600)[1])

    threads = [threading.Thread(target=unsettle) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert answers.count(True) == 10 and len(answers) == 40
    assert store.tally(name) == {"total": 10, "pending": 10, "processed": 0, "failed": 0}


def test_a_tally_settled_from_many_threads_is_exact(store: LockStore) -> None:
    name = key()
    store.tally_add(name, {"total": 40, "pending": 40, "processed": 0, "failed": 0}, 3600)
    news: list[bool] = []
    barrier = threading.Barrier(4)

    def settle(offset: int) -> None:
        barrier.wait()
        for n in range(40):  # every thread settles every member: each counts once
            news.append(store.tally_settle(name, f"job-{(n + offset) % 40}", "processed", 3600)[1])

    threads = [threading.Thread(target=settle, args=(i * 10,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert news.count(True) == 40
    assert store.tally(name) == {"total": 40, "pending": 0, "processed": 40, "failed": 0}


def test_many_members_of_several_tallies_settle_at_once_each_once(store: LockStore) -> None:
    first, second = key(), key()
    store.tally_add(first, {"total": 4, "pending": 4, "processed": 0, "failed": 0}, 3600)
    store.tally_add(second, {"total": 2, "pending": 2, "processed": 0, "failed": 0}, 3600)
    store.tally_settle(first, "job-1", "processed", 3600)
    # job-1 was settled before; job-2 comes twice; "skipped" is a count the tally did not start with
    items = [
        (first, "job-1", "processed", 3600.0),
        (first, "job-2", "failed", 3600.0),
        (second, "job-9", "processed", 3600.0),
        (first, "job-2", "failed", 3600.0),
        (first, "job-3", "skipped", 3600.0),
    ]
    settled = store.tally_settle_many(items)
    assert [new for _, new in settled] == [False, True, True, False, True]
    after_first = {"total": 4, "pending": 1, "processed": 1, "failed": 1, "skipped": 1}
    after_second = {"total": 2, "pending": 1, "processed": 1, "failed": 0}
    assert [counts for counts, _ in settled] == [after_first, after_first, after_second, after_first, after_first]
    assert store.tally(first) == after_first and store.tally(second) == after_second
    assert store.tally_settle_many([]) == []
    assert store.tally_settle_many(items[:2]) == [(after_first, False), (after_first, False)], "settled once"


def test_a_tally_settled_in_rounds_from_many_threads_is_exact(store: LockStore) -> None:
    name = key()
    store.tally_add(name, {"total": 60, "pending": 60, "processed": 0, "failed": 0}, 3600)
    news: list[bool] = []
    barrier = threading.Barrier(3)

    def settle(offset: int) -> None:
        barrier.wait()
        for start in range(0, 60, 12):  # every thread settles every member, 12 at a time
            items = [(name, f"job-{(n + offset) % 60}", "processed", 3600.0) for n in range(start, start + 12)]
            news.extend(new for _, new in store.tally_settle_many(items))

    threads = [threading.Thread(target=settle, args=(i * 20,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert news.count(True) == 60
    assert store.tally(name) == {"total": 60, "pending": 0, "processed": 60, "failed": 0}


def test_a_tally_added_to_while_it_settles_is_exact_and_reads_back_whole(store: LockStore) -> None:
    name = key()
    store.tally_add(name, {"total": 30, "pending": 30}, 3600)
    seen: list[dict[str, int]] = []
    barrier = threading.Barrier(4)

    def add() -> None:
        barrier.wait()
        for _ in range(15):  # a job of the batch adding more to it, as context.batch.add does
            seen.append(store.tally_add(name, {"total": 2, "pending": 2}, 3600))

    def settle(offset: int) -> None:
        barrier.wait()
        for n in range(30):  # the first settle of a failure adds the field "failed"
            store.tally_settle(name, f"job-{(n + offset) % 30}", "failed" if n % 7 == 0 else "processed", 3600)

    threads = [threading.Thread(target=add), threading.Thread(target=add)]
    threads += [threading.Thread(target=settle, args=(i * 15,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "two changes of one tally deadlocked"
    final = store.tally(name)
    assert final is not None and final["total"] == 90
    assert final["pending"] == 90 - 30 and final["processed"] + final["failed"] == 30
    # Each add reads back the whole tally as it left it: every count, and never less than was settled before.
    assert all({"total", "pending"} <= set(counts) for counts in seen)
    for counts in seen:
        assert counts["total"] - counts["pending"] == counts.get("processed", 0) + counts.get("failed", 0), counts


@dataclass
class Tick(Job):
    NAME = "tests.contract.tick"

    def handle(self, context: JobContext) -> None:
        pass


def test_the_fleet_is_recorded_counted_and_aged_out(store: LockStore) -> None:
    """Workers record themselves and their counts per minute in the store; a
    stopped one leaves, a dead one lapses, and a listing lowers its flag."""
    from rainier_sync import Container, JobRegistry, QueueManager, Worker, WorkerOptions
    from rainier_sync.drivers import MemoryQueue
    from rainier_sync.fleet import RECORD_TTL

    connection = key()
    manager = QueueManager(
        {connection: MemoryQueue()}, registry=JobRegistry().with_job(Tick), container=Container(), locks=store
    )
    with freeze_time("2026-01-01 00:00:10") as clock:
        manager.dispatch_many([Tick() for _ in range(5)])
        manager.dispatch_on("other", Tick())
        done = Worker(manager, options=WorkerOptions(queues=["default", "other"], once=True, concurrency=2))
        assert done.run().processed == 6
        assert manager.workers(connection) == []
        dead = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=3))
        alive = Worker(manager, options=WorkerOptions(queues=["other"], concurrency=1))
        assert dead.fleet is not None and alive.fleet is not None
        dead.fleet.refresh()
        alive.fleet.refresh()
        found = {w.id: w for w in manager.workers(connection)}
        assert set(found) == {dead.fleet.id, alive.fleet.id}
        assert found[dead.fleet.id].queues == ("default",) and found[dead.fleet.id].concurrency == 3
        assert found[dead.fleet.id].last_heartbeat == pytest.approx(1767225610.0)
        (minute,) = manager.throughput(connection, minutes=1)
        assert minute.minute == 1767225600
        assert minute.by_queue == {"default": {"processed": 5}, "other": {"processed": 1}}
        clock.tick(RECORD_TTL / 2)
        alive.fleet.refresh()
        clock.tick(RECORD_TTL / 2 + 1)
        assert [w.id for w in manager.workers(connection)] == [alive.fleet.id]
        assert store.flags(f"workers:{connection}") == {alive.fleet.id}
        alive.fleet.leave()
        assert manager.workers(connection) == [] and store.flags(f"workers:{connection}") == set()
        assert [m.processed for m in manager.throughput(connection, minutes=2)] == [0, 5 + 1]
