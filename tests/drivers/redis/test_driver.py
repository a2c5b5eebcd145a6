"""The Redis driver's own behaviour against the real server (the shared contract suite runs separately)."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis
from freezegun import freeze_time

from rainier_sync import QueuedJob, QueueDriver, QueueManager, Worker, WorkerOptions, _clock, signals
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.redis import RedisUnavailableError
from rainier_sync.errors import ConfigurationError
from tests.support import wait_until

from . import jobs

pytestmark = pytest.mark.redis


def job(queue: str = "default", *, delay: float = 0.0, priority: int = 0, **payload: object) -> QueuedJob:
    now = _clock.now()
    return QueuedJob(
        id=uuid.uuid4().hex,
        name="redis-tests.plain",
        queue=queue,
        payload=dict(payload) or {"x": 1},
        max_attempts=3,
        priority=priority,
        available_at=now + delay,
        dispatched_at=now,
    )


@pytest.fixture
def make(redis_url: str, prefix: str) -> Iterator[object]:
    made: list[RedisQueue] = []

    def build(**options: object) -> RedisQueue:
        queue = RedisQueue.from_url(redis_url, prefix=prefix, **options)  # type: ignore[arg-type]
        made.append(queue)
        return queue

    yield build
    for queue in made:
        queue.close()


@pytest.fixture
def queue(make) -> RedisQueue:  # type: ignore[no-untyped-def]
    return make(reservation=30)  # type: ignore[no-any-return]


def stream(prefix: str, queue: str = "default", band: int = 0) -> str:
    return f"{prefix}{queue}:ready:{band}"


# -- where things live --------------------------------------------------------------


def test_jobs_live_under_the_prefix_in_the_urls_database(queue: RedisQueue, redis_client, prefix: str) -> None:
    queue.push(job())
    assert redis_client.connection_pool.connection_kwargs["db"] == 13
    assert redis_client.xlen(stream(prefix)) == 1
    other = redis.Redis(host="127.0.0.1", port=6379, db=0)
    try:
        assert not list(other.scan_iter(match=prefix + "*", count=1000))
    finally:
        other.close()
    assert QueueDriver.REDIS.may_lose_an_accepted_job()
    assert "13" in queue.describe() and prefix in queue.describe()


def test_each_priority_is_its_own_stream_read_lowest_first(queue: RedisQueue, redis_client, prefix: str) -> None:
    later, sooner, first = job(priority=5), job(priority=0), job(priority=-3)
    queue.push_many([later, sooner, first])
    assert [redis_client.xlen(stream(prefix, band=b)) for b in (-3, 0, 5)] == [1, 1, 1]
    got = queue.reserve_many(["default"], 10)
    assert [j.id for j in got] == [first.id, sooner.id, later.id]


def test_push_many_in_bulk_spans_queues_and_script_calls(queue: RedisQueue) -> None:
    batch = [job("bulk-a" if i % 3 else "bulk-b", i=i) for i in range(2500)]
    assert queue.push_many(batch) == [j.id for j in batch]
    assert queue.size("bulk-a") + queue.size("bulk-b") == 2500
    assert queue.queue_names() == ["bulk-a", "bulk-b"]
    taken = {j.id for j in queue.reserve_many(["bulk-a", "bulk-b"], 3000)}
    assert taken == {j.id for j in batch}


def test_counts_tell_ready_delayed_and_reserved_apart(queue: RedisQueue) -> None:
    queue.push_many([job(), job(), job(delay=600)])
    assert queue.reserve(["default"]) is not None
    counts = queue.counts("default")
    assert (counts.ready, counts.delayed, counts.reserved) == (1, 1, 1)
    assert queue.size() == queue.size("default") == 3


# -- delays and reservations -----------------------------------------------------------


def test_concurrent_reservers_promote_each_delayed_job_exactly_once(make) -> None:  # type: ignore[no-untyped-def]
    producer = make()
    delayed = [job(delay=0.3, i=i) for i in range(300)]
    producer.push_many(delayed)
    taken: list[str] = []
    lock = threading.Lock()

    def reserve_until_done() -> None:
        mine = make()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with lock:
                if len(taken) >= len(delayed):
                    return
            got = mine.reserve_many(["default"], 7)
            if got:
                with lock:
                    taken.extend(j.id for j in got)
            else:
                time.sleep(0.005)

    threads = [threading.Thread(target=reserve_until_done) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert sorted(taken) == sorted(j.id for j in delayed), "every delayed job handed out once, none lost"
    assert producer.counts("default").delayed == 0


def test_a_release_by_a_worker_whose_reservation_was_reclaimed_changes_nothing(make) -> None:  # type: ignore[no-untyped-def]
    with freeze_time("2026-03-01 12:00:00") as frozen:
        queue = make(reservation=30)
        queue.push(job())
        stale = queue.reserve(["default"])
        assert stale is not None
        frozen.tick(31)
        assert queue.reclaim_expired() == 1
        queue.release(stale, 0)
        queue.acknowledge(stale)
        assert queue.size("default") == 1, "the reclaimed job is still queued, once"
        again = queue.reserve(["default"])
        assert again is not None and again.id == stale.id and again.attempts == 2


def test_extend_renews_the_pending_entry_for_its_owner(queue: RedisQueue, redis_client, prefix: str) -> None:
    queue.push(job())
    got = queue.reserve(["default"])
    assert got is not None
    member = f"0|{got.receipt.entry.decode()}".ljust(72)  # padded: see _HELD in the driver
    before = redis_client.zscore(prefix + "default:reserved", member)
    wait_until(
        lambda: redis_client.xpending_range(stream(prefix), "rainier", "-", "+", 1)[0]["time_since_delivered"] >= 20,
        timeout=5,
        message="the entry to sit idle",
    )
    queue.extend([got], 60)
    pending = redis_client.xpending_range(stream(prefix), "rainier", "-", "+", 1)[0]
    assert pending["consumer"].decode() == queue.consumer
    assert pending["time_since_delivered"] < 20
    assert redis_client.zscore(prefix + "default:reserved", member) > before


def test_xautoclaim_takes_back_what_a_consumer_left_with_no_reservation_on_record(
    make, redis_client, prefix: str
) -> None:  # type: ignore[no-untyped-def]
    queue = make(reservation=0.2)
    queue.push(job())
    redis_client.xgroup_create(stream(prefix), "rainier", id="0", mkstream=True)
    left = redis_client.xreadgroup("rainier", "ghost", {stream(prefix): ">"}, count=1)
    assert left, "the ghost consumer holds the entry"
    assert queue.reserve(["default"]) is None
    wait_until(lambda: queue.reclaim_expired() == 1, timeout=5, interval=0.05, message="XAUTOCLAIM to take it back")
    again = queue.reserve(["default"])
    assert again is not None and again.attempts == 2


# -- unreadable entries ---------------------------------------------------------------


def test_an_unreadable_entry_goes_to_the_failed_store_and_reserve_carries_on(
    queue: RedisQueue, redis_client, prefix: str
) -> None:
    heard: list[dict[str, object]] = []

    def on_discarded(sender: object, **kwargs: object) -> None:
        heard.append(kwargs)

    signals.queue_message_discarded.connect(on_discarded)
    try:
        queue.push(job())  # creates the band
        redis_client.xadd(stream(prefix), {"j": "{not json", "a": "0"})
        redis_client.xadd(stream(prefix), {"something": "else"})
        good = job(marker="after")
        queue.push(good)
        got = queue.reserve_many(["default"], 10)
    finally:
        signals.queue_message_discarded.disconnect(on_discarded)
    assert [j.payload for j in got] == [{"x": 1}, {"marker": "after"}]
    assert len(heard) == 2
    assert "not valid JSON" in str(heard[0]["error"]) and "{not json" in str(heard[0]["raw"])
    assert "no 'j'" in str(heard[1]["error"])
    failed = queue.failed_jobs(10)
    assert {f.name for f in failed} == {"<unreadable>"} and len(failed) == 2
    assert redis_client.xlen(stream(prefix)) == 2, "the unreadable entries left the stream"


def test_a_worker_goes_on_past_an_unreadable_entry(
    redis_url: str, queue: RedisQueue, redis_client, prefix: str
) -> None:
    from rainier_sync import QueueManager

    manager = QueueManager({"redis": queue}, registry=jobs.registry(), container=jobs.container(redis_url))
    manager.dispatch(jobs.Record(prefix, 1))
    redis_client.xadd(stream(prefix), {"j": "[]", "a": "0"})
    manager.dispatch(jobs.Record(prefix, 2))
    stats = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, once=True)).run()
    assert stats.processed == 2
    assert redis_client.hgetall(prefix + "ran") == {b"1": b"1", b"2": b"1"}
    assert queue.failed_count() == 1


def test_retry_and_forget_of_failed_jobs(queue: RedisQueue) -> None:
    queue.push(job(marker="m"))
    got = queue.reserve(["default"])
    assert got is not None
    queue.fail(got, RuntimeError("boom"))
    [failed] = queue.failed_jobs()
    assert failed.exception.kind == "RuntimeError" and failed.attempts == 1
    assert queue.failed_count() == 1
    assert queue.retry_failed(got.id) and not queue.retry_failed(got.id)
    again = queue.reserve(["default"])
    assert again is not None and again.payload == {"marker": "m"} and again.attempts == 1
    queue.fail(again, "again")
    assert queue.forget_failed(got.id) and not queue.forget_failed(got.id)
    assert queue.failed_count() == 0


# -- waiting for work ---------------------------------------------------------------------


def _waits(queue: RedisQueue, waker: Waker, timeout: float = 5.0) -> float:
    waker.clear()  # as the worker's loop does before it looks for work
    started = time.monotonic()
    queue.wait_for_jobs(["default"], timeout, waker)
    return time.monotonic() - started


def test_an_idle_wait_wakes_when_another_client_pushes(make) -> None:  # type: ignore[no-untyped-def]
    worker_side, producer = make(), make()
    waker = Waker()
    try:
        # the first wait subscribes and returns at once, so the caller looks again
        assert worker_side.reserve_many(["default"], 1) == []
        _waits(worker_side, waker)
        assert worker_side.reserve_many(["default"], 1) == []
        timer = threading.Timer(0.2, lambda: producer.push(job()))
        timer.start()
        waited = _waits(worker_side, waker)
        timer.join()
        assert waited < 4.0, "the push woke the wait long before its timeout"
        assert len(worker_side.reserve_many(["default"], 1)) == 1
    finally:
        waker.close()


def test_an_idle_wait_ends_when_the_soonest_delayed_job_is_due(queue: RedisQueue) -> None:
    waker = Waker()
    try:
        queue.reserve_many(["default"], 1)
        _waits(queue, waker)  # subscribes
        pushed = job(delay=0.4)
        queue.push(pushed)
        got: list[QueuedJob] = []
        started = time.monotonic()
        for _ in range(20):  # a worker's loop: look, then wait (a wait may end early on a stale notification)
            got = queue.reserve_many(["default"], 1)
            if got:
                break
            _waits(queue, waker)
        assert [j.id for j in got] == [pushed.id]
        assert _clock.now() >= pushed.available_at, "never handed out before it is due"
        assert time.monotonic() - started < 4.0, "the wait ended at the due time, not at its 5 s timeout"
    finally:
        waker.close()


def test_an_idle_wait_returns_when_the_waker_is_set(queue: RedisQueue) -> None:
    waker = Waker()
    try:
        queue.reserve_many(["default"], 1)
        _waits(queue, waker)  # subscribes
        queue.reserve_many(["default"], 1)
        waker.clear()
        threading.Timer(0.1, waker.set).start()
        started = time.monotonic()
        queue.wait_for_jobs(["default"], 5.0, waker)
        assert time.monotonic() - started < 4.0
    finally:
        waker.close()


def test_two_loops_on_one_queue_do_not_take_each_others_wake_up(make) -> None:  # type: ignore[no-untyped-def]
    # two workers (two owning loops) on one connection: a reserve by one must not
    # mark the notification the other was owed as seen
    worker_side, producer = make(), make()
    waker, other_waker = Waker(), Waker()
    try:
        assert worker_side.reserve_many(["a"], 1) == []
        worker_side.wait_for_jobs(["a"], 0.3, waker)  # subscribes
        assert worker_side.reserve_many(["a"], 1) == []  # loop A looks: nothing
        seq = worker_side._wake_seq
        producer.push(job("a"))

        def loop_b() -> None:  # looks at its queue, then idles: it reads the push's notification
            worker_side.reserve_many(["b"], 1)
            worker_side.wait_for_jobs(["b"], 3.0, other_waker)

        other = threading.Thread(target=loop_b)
        other.start()
        other.join(5)
        assert worker_side._wake_seq > seq, "loop B read the notification"
        waker.clear()
        started = time.monotonic()
        worker_side.wait_for_jobs(["a"], 3.0, waker)  # loop A idles
        assert time.monotonic() - started < 1.5, "loop A slept through the push it was notified of"
    finally:
        waker.close()
        other_waker.close()


# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"url": "http://127.0.0.1:6379/1"}, "redis://"),
        ({"prefix": ""}, "prefix"),
        ({"prefix": "app\ud800:"}, "prefix"),
        ({"reservation": 0}, "reservation"),
        ({"connect_timeout_ms": -1}, "connect_timeout_ms"),
        ({"response_timeout_ms": "fast"}, "response_timeout_ms"),
        ({"reconnect": "yes"}, "reconnect"),
        ({"reconnect_attempts": 3}, "reconnect_attempts"),
        ({"reconnect_max_backoff_ms": 500}, "reconnect_max_backoff_ms"),
        ({"reconnect": True, "reconnect_attempts": 0}, "reconnect_attempts"),
    ],
)
def test_bad_settings_fail_at_construction_naming_the_setting(redis_url: str, options: dict, named: str) -> None:
    kwargs = {"url": redis_url, **options}
    with pytest.raises(ConfigurationError, match=named):
        RedisQueue.from_url(**kwargs)


def test_timeouts_and_reconnect_reach_the_connections(redis_url: str) -> None:
    queue = RedisQueue.from_url(
        redis_url,
        connect_timeout_ms=2000,
        response_timeout_ms=250,
        reconnect=True,
        reconnect_attempts=4,
        reconnect_max_backoff_ms=300,
    )
    try:
        kwargs = queue.client.connection_pool.connection_kwargs
        assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (2.0, 0.25)
        assert kwargs["retry"].get_retries() == 0, "the driver retries, building each try's arguments anew"
        assert queue._policy == (4, 0.3)
        assert [queue._policy.pause(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]
        plain = RedisQueue.from_url(redis_url)
        assert plain._policy.retries == 0, "reconnect is off by default"
        assert RedisQueue.from_url(redis_url, reconnect=True)._policy == (3, 1.0)
        plain.close()
    finally:
        queue.close()


def test_check_eviction_policy_warns_unless_noeviction(
    queue: RedisQueue, redis_client, caplog: pytest.LogCaptureFixture
) -> None:
    raw = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    policy = raw.decode() if isinstance(raw, bytes) else raw
    with caplog.at_level(logging.WARNING, logger="rainier_sync"):
        assert queue.check_eviction_policy() == policy
    assert ("maxmemory-policy" in caplog.text) == (policy != "noeviction")
    caplog.clear()
    # maxmemory stays 0 here, so the policy change cannot evict anything meanwhile
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with caplog.at_level(logging.WARNING, logger="rainier_sync"):
            assert queue.check_eviction_policy() == "allkeys-lru"
    finally:
        redis_client.config_set("maxmemory-policy", policy)
    assert "allkeys-lru" in caplog.text and "noeviction" in caplog.text


def test_without_redis_py_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from rainier_sync.errors import DriverUnavailableError\n"
        "try:\n    from rainier_sync.drivers import RedisQueue\n"
        "except DriverUnavailableError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'rainier_sync[redis]'" in out.stdout


def test_payloads_with_tabs_and_newlines_round_trip(queue: RedisQueue) -> None:
    pushed = [job(text="a\tb\nc\r\n", other="\u2028 ✓"), job(text="\n")]
    queue.push_many(pushed)
    got = queue.reserve_many(["default"], 5)
    assert [j.payload for j in got] == [j.payload for j in pushed]


def test_a_queue_name_that_cannot_be_a_key_is_refused_naming_it(queue: RedisQueue) -> None:
    with pytest.raises(ValueError, match="bad\\\\tname"):
        queue.push(job("bad\tname"))
    assert queue.queue_names() == []


def test_scripts_the_server_does_not_have_cached_are_loaded_on_the_way(queue: RedisQueue) -> None:
    # as after a SCRIPT FLUSH or a failover, without flushing a shared server: the
    # driver's idea of each script's SHA1 is one the server has never seen
    for name in ("push", "reserve", "ack", "release"):
        queue._scripts[name].sha = "0" * 40
    queue.push_many([job(), job()])
    first, second = queue.reserve_many(["default"], 2)
    queue.acknowledge_many([first])
    queue.release(second, 0)
    again = queue.reserve_many(["default"], 2)
    assert [j.id for j in again] == [second.id]
    queue.acknowledge(again[0])
    assert queue.size("default") == 0


def test_reclaim_forgets_consumers_of_dead_workers(make, redis_client, prefix: str) -> None:  # type: ignore[no-untyped-def]
    queue = make(reservation=0.1)
    queue.push_many([job(), job()])
    mine = queue.reserve(["default"])
    assert mine is not None
    [(_, [(entry, _)])] = redis_client.xreadgroup("rainier", "ghost", {stream(prefix): ">"}, count=1)
    redis_client.xack(stream(prefix), "rainier", entry)  # the ghost finished its job, then its process died

    def consumers() -> set[str]:
        return {c["name"].decode() for c in redis_client.xinfo_consumers(stream(prefix), "rainier")}

    assert consumers() == {"ghost", queue.consumer}
    queue.extend([mine], 60)  # our own consumer stays busy, and is never forgotten while it holds a job
    wait_until(
        lambda: queue.reclaim_expired() >= 0 and "ghost" not in consumers(),
        timeout=10,
        interval=0.1,
        message="the ghost consumer to be forgotten",
    )
    assert queue.consumer in consumers()


def test_delays_and_backoff_follow_frozen_time_in_a_once_worker(redis_url: str, redis_client, prefix: str) -> None:
    from rainier_sync import QueueManager

    with freeze_time("2026-03-01 12:00:00") as frozen:
        queue = RedisQueue.from_url(redis_url, prefix=prefix)
        manager = QueueManager({"redis": queue}, registry=jobs.registry(), container=jobs.container(redis_url))
        once = WorkerOptions(queues=["default"], concurrency=2, once=True)
        try:
            manager.dispatch_after(60, jobs.Record(prefix, 7))
            manager.dispatch(jobs.Flaky(prefix))
            first = Worker(manager, options=once).run()
            assert (first.processed, first.released) == (0, 1), "the delayed job waits; Flaky fails and backs off"
            frozen.tick(31)
            assert Worker(manager, options=once).run().processed == 1
            assert redis_client.get(prefix + "flaky-succeeded") == b"2"
            assert redis_client.hgetall(prefix + "ran") == {}
            frozen.tick(30)
            assert Worker(manager, options=once).run().processed == 1
            assert redis_client.hgetall(prefix + "ran") == {b"7": b"1"}
        finally:
            manager.close()


def test_a_server_that_never_answers_fails_a_dispatch_within_the_response_timeout() -> None:
    # a listener that accepts and then says nothing: what a hung server or a black-holing
    # network looks like, which the real server cannot be made to do without stalling everyone
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    queue = RedisQueue.from_url(f"redis://127.0.0.1:{port}/0", connect_timeout_ms=500, response_timeout_ms=200)
    try:
        started = time.monotonic()
        with pytest.raises(RedisUnavailableError, match="Timeout"):
            queue.push(job())
        assert time.monotonic() - started < 5.0, "bounded by the response timeout, not hanging"
    finally:
        stop.set()
        thread.join(2)
        queue.close()
        for conn in accepted:
            conn.close()
        listener.close()


def test_a_forked_child_uses_connections_of_its_own(queue: RedisQueue) -> None:
    import multiprocessing

    queue.push(job("parent"))
    assert queue.reserve(["parent"]) is not None  # the parent's connections are open now

    def cycles(name: str) -> None:
        for n in range(300):
            queue.push(job(name, n=n))
            got = queue.reserve([name])
            assert got is not None and got.payload == {"n": n}, (name, n, got)
            queue.acknowledge(got)

    # both processes at once: on a shared socket they would read each other's replies.
    # The child must not finalise what other tests left in this test process (a
    # Kafka client's threads do not survive a fork): its garbage stays frozen.
    gc.collect()
    gc.freeze()
    try:
        process = multiprocessing.get_context("fork").Process(target=cycles, args=("child",))
        process.start()
    finally:
        gc.unfreeze()
    cycles("parent")
    process.join(60)
    assert process.exitcode == 0
    assert queue.size("child") == 0 and queue.size("parent") == 1


def test_an_acknowledgement_needs_no_cached_script_even_when_its_reply_is_never_read(
    redis_url: str, redis_client, prefix: str
) -> None:
    # a once run ends right after the reserve that reads the last acknowledgement's
    # reply; on a server without the script cached (fresh, failed over, SCRIPT FLUSH)
    # that reply was NOSCRIPT, and with no close() the job stayed reserved to run again
    from rainier_sync import QueueManager

    queue = RedisQueue.from_url(redis_url, prefix=prefix, reservation=30)
    queue._scripts["ack"].sha = "0" * 40
    manager = QueueManager({"redis": queue}, registry=jobs.registry(), container=jobs.container(redis_url))
    try:
        manager.dispatch(jobs.Record(prefix, 1))
        stats = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=1, once=True)).run()
        assert stats.processed == 1
        assert redis_client.zcard(prefix + "default:reserved") == 0, "the job is still reserved after the run"
        assert redis_client.xpending(stream(prefix), "rainier")["pending"] == 0
    finally:
        manager.close()


def test_an_acknowledgement_whose_send_fails_is_sent_again(make, redis_client, prefix: str) -> None:  # type: ignore[no-untyped-def]
    queue = make(reservation=30, reconnect=True)
    queue.push_many([job(), job()])
    first, second = queue.reserve_many(["default"], 2)
    queue.acknowledge_many([first])  # sent; its reply is read later
    (line,) = queue._lines.values()
    conn = line.conn

    def broken(*args: object, **kwargs: object) -> None:
        del conn.send_command  # once: the connection goes back to the pool
        raise redis.ConnectionError("Error 32 while writing to socket. Broken pipe.")

    conn.send_command = broken  # the peer reset the loop connection
    queue.acknowledge_many([second])  # with reconnect: sent again on a new connection
    assert queue.size("default") == 0, "the acknowledgement that could not be sent was dropped"
    assert redis_client.zcard(prefix + "default:reserved") == 0


def test_an_error_in_a_bulk_push_leaves_no_reply_for_the_next_dispatch(
    queue: RedisQueue, redis_client, prefix: str
) -> None:
    redis_client.set(prefix + "bad:ready:0", "not a stream")  # every XADD on queue "bad" fails
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.push_many([job("bad")] + [job("good", blob="x" * 1000) for _ in range(1999)])
    (line,) = queue._push_lines.values()
    assert not line.conn.can_read(timeout=0.5), "a later chunk's reply is left on the producers' connection"
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.push(job("bad"))  # its own error, not a stale success
    assert queue.size("good") == 1000, "the chunk after the failed one is stored, and said so"


def test_a_reserve_of_thousands_records_every_reservation(queue: RedisQueue, redis_client, prefix: str) -> None:
    # Lua's unpack() stops near 8000 values: one ZADD of every deadline failed the
    # script after XREADGROUP had already taken the entries
    queue.push_many([job() for _ in range(4500)])
    got = queue.reserve_many(["default"], 4500)
    assert len(got) == 4500
    assert redis_client.zcard(prefix + "default:reserved") == 4500
    queue.acknowledge_many(got)
    assert queue.size("default") == 0


def test_a_fail_by_a_worker_whose_reservation_was_reclaimed_leaves_no_failed_copy(redis_url: str, prefix: str) -> None:
    with freeze_time("2026-03-01 12:00:00") as frozen:
        queue = RedisQueue.from_url(redis_url, prefix=prefix, reservation=30)
        try:
            queue.push(job())
            stale = queue.reserve(["default"])
            assert stale is not None
            frozen.tick(31)
            assert queue.reclaim_expired() == 1
            queue.fail(stale, "boom")  # the stale worker's attempt failed after all
            assert queue.failed_count() == 0, "a failed copy beside the requeued job"
            assert queue.size("default") == 1
            again = queue.reserve(["default"])
            assert again is not None and again.id == stale.id
            queue.fail(again, "boom")  # the holder's own fail still moves it
            assert queue.failed_count() == 1 and queue.size("default") == 0
        finally:
            queue.close()


def test_a_discard_that_fails_does_not_strand_the_jobs_reserved_with_it(
    queue: RedisQueue, redis_client, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue.push(job())
    redis_client.xadd(stream(prefix), {"j": "{not json", "a": "0"})
    queue.push(job(marker="after"))

    on_loop = queue._on_loop_connection

    def down(script: str, keys: list[str], args: Any) -> Any:
        if script == "fail":
            raise RedisUnavailableError("redis connection 'default': fail failed: Connection reset by peer")
        return on_loop(script, keys, args)

    monkeypatch.setattr(queue, "_on_loop_connection", down)  # moving the bad entry aside fails
    got = queue.reserve_many(["default"], 10)
    assert [j.payload for j in got] == [{"x": 1}, {"marker": "after"}], "reserved, and handed out"


# -- the idle loop's blocking read ---------------------------------------------------------
# A blocking read belongs to one owning loop (one thread): each test runs its loop's
# calls on one thread of its own.


@pytest.fixture
def loop() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1, thread_name_prefix="owning-loop") as pool:
        yield pool


def go_idle(loop: ThreadPoolExecutor, queue: RedisQueue, queues: list[str], seconds: float) -> tuple[Future, Waker]:
    """The loop finds its queues (which have held a job, so their streams exist)
    empty and idles; returns its wait (to join) and its waker."""
    waker = Waker()

    def look() -> None:
        assert queue.reserve_many(queues, 1) == []
        queue.wait_for_jobs(queues, 0.2, waker)  # subscribes; the confirmation ends this first wait
        waker.clear()
        assert queue.reserve_many(queues, 1) == []

    loop.submit(look).result(5)
    wait = loop.submit(queue.wait_for_jobs, queues, seconds, waker)
    wait_until(lambda: waker in queue._waiters and reading(queue), 5, message="the wait and its blocking read")
    return wait, waker


def reading(queue: RedisQueue) -> bool:
    return any(read.streams is not None for read in queue._all_reads)


def the_read(queue: RedisQueue) -> Any:
    (read,) = queue._all_reads
    return read


def used(queue: RedisQueue, name: str = "default") -> None:
    """Give ``name`` a stream with its consumer group, as a queue that has run jobs has."""
    queue.push(job(name))
    (taken,) = queue.reserve_many([name], 1)
    queue.acknowledge(taken)
    queue._sync()


def test_a_job_pushed_to_an_idle_loop_arrives_with_the_push_and_is_reserved(
    make, loop: ThreadPoolExecutor, redis_client, prefix: str  # type: ignore[no-untyped-def]
) -> None:
    worker_side, producer = make(reservation=30), make()
    used(worker_side)
    wait, waker = go_idle(loop, worker_side, ["default"], 5.0)
    pushed = job()
    producer.push(pushed)
    wait.result(5)
    assert [entry[0] for entry in the_read(worker_side).stash] == ["default"], "taken before any reserve"
    (got,) = loop.submit(worker_side.reserve_many, ["default"], 8).result(5)
    assert (got.id, got.attempts) == (pushed.id, 1)
    loop.submit(worker_side._sync).result(5)
    member = f"0|{got.receipt.entry.decode()}".ljust(72)
    assert redis_client.zscore(prefix + "default:reserved", member) is not None, "its reservation is on record"
    pending = redis_client.xpending_range(stream(prefix), "rainier", "-", "+", 10)
    assert [p["consumer"].decode() for p in pending] == [worker_side.consumer]
    assert loop.submit(worker_side.reserve_many, ["default"], 8).result(5) == [], "handed out once"
    loop.submit(worker_side.acknowledge, got).result(5)
    loop.submit(worker_side._sync).result(5)
    assert redis_client.xlen(stream(prefix)) == 0 and redis_client.zcard(prefix + "default:reserved") == 0
    waker.close()


def test_what_a_loop_s_read_took_goes_to_that_loop_and_queue_only(make, loop: ThreadPoolExecutor) -> None:  # type: ignore[no-untyped-def]
    worker_side, producer = make(), make()
    used(worker_side, "other")
    wait, waker = go_idle(loop, worker_side, ["other"], 5.0)
    producer.push(job("other"))
    wait.result(5)
    assert worker_side.reserve_many(["other"], 8) == [], "another loop (thread) does not get it"
    assert loop.submit(worker_side.reserve_many, ["default"], 8).result(5) == []
    assert len(loop.submit(worker_side.reserve_many, ["other"], 8).result(5)) == 1
    waker.close()


def test_closing_hands_back_what_the_blocking_read_took_uncounted(make, loop: ThreadPoolExecutor) -> None:  # type: ignore[no-untyped-def]
    worker_side, producer = make(), make()
    used(worker_side)
    wait, waker = go_idle(loop, worker_side, ["default"], 5.0)
    pushed = job()
    producer.push(pushed)
    wait.result(5)
    waker.close()
    worker_side.close()  # its read took the job, and nobody reserved it
    again = producer.reserve_many(["default"], 8)
    assert [(j.id, j.attempts) for j in again] == [(pushed.id, 1)]


def test_a_blocking_read_cut_off_loses_nothing(make, loop: ThreadPoolExecutor, redis_client) -> None:  # type: ignore[no-untyped-def]
    worker_side, producer = make(reservation=1), make()
    used(worker_side)
    wait, waker = go_idle(loop, worker_side, ["default"], 0.5)
    redis_client.client_kill_filter(_id=the_read(worker_side).client_id)
    wait.result(5)
    pushed = job()
    producer.push(pushed)
    got = loop.submit(worker_side.reserve_many, ["default"], 8).result(5)
    if not got:  # the push may have raced the kill into the read that died: the net puts it back
        time.sleep(1.2)
        producer.reclaim_expired()
        got = producer.reserve_many(["default"], 8)
    assert [j.id for j in got] == [pushed.id]
    waker.close()


def test_an_entry_the_read_took_long_ago_is_not_handed_out_after_the_net_put_it_back(
    make, loop: ThreadPoolExecutor  # type: ignore[no-untyped-def]
) -> None:
    worker_side, other = make(reservation=1), make(reservation=1)
    used(worker_side)
    wait, waker = go_idle(loop, worker_side, ["default"], 5.0)
    pushed = job()
    other.push(pushed)
    wait.result(5)  # taken by the read; this loop then stays busy past its reservation
    time.sleep(1.2)
    assert other.reclaim_expired() == 1, "the net puts back an entry pending with no reservation on record"
    (again,) = other.reserve_many(["default"], 8)
    assert (again.id, again.attempts) == (pushed.id, 2)
    assert loop.submit(worker_side.reserve_many, ["default"], 8).result(5) == [], "it is the other worker's now"
    waker.close()


def test_recording_a_reservation_again_after_a_release_changes_nothing(
    make, loop: ThreadPoolExecutor, prefix: str, redis_client  # type: ignore[no-untyped-def]
) -> None:
    worker_side, producer = make(), make()
    used(worker_side)
    wait, waker = go_idle(loop, worker_side, ["default"], 5.0)
    producer.push(job())
    wait.result(5)
    (taken,) = the_read(worker_side).stash
    (got,) = loop.submit(worker_side.reserve_many, ["default"], 8).result(5)
    loop.submit(worker_side.release, got, 0).result(5)
    # the record sent again, as a connection lost before its reply was read would have it
    (call,) = worker_side._adopt_calls([taken])
    call.args[2] = "9999999999.0"
    assert worker_side._run("adopt", call.keys, call.args) == []
    assert redis_client.zcard(prefix + "default:reserved") == 0
    assert len(producer.reserve_many(["default"], 8)) == 1, "one copy, queued once"
    waker.close()


def test_a_forked_child_does_not_take_what_its_parent_s_read_took(make, loop: ThreadPoolExecutor) -> None:  # type: ignore[no-untyped-def]
    worker_side, producer = make(), make()
    used(worker_side)
    wait, waker = go_idle(loop, worker_side, ["default"], 5.0)
    producer.push(job())
    wait.result(5)

    def as_a_forked_child() -> Any:
        worker_side._pid = -1  # what a fork looks like to the driver
        return worker_side.reserve_many(["default"], 8)

    assert loop.submit(as_a_forked_child).result(5) == []
    waker.close()


def test_a_closed_queue_s_wait_sleeps_instead_of_spinning(make) -> None:  # type: ignore[no-untyped-def]
    queue = make()
    used(queue)
    queue.close()
    waker = Waker()
    started = time.monotonic()
    queue.wait_for_jobs(["default"], 0.3, waker)
    assert time.monotonic() - started >= 0.25
    waker.close()


def test_a_subscription_dropped_by_another_loop_ends_the_wait_cleanly(make, loop: ThreadPoolExecutor) -> None:  # type: ignore[no-untyped-def]
    queue = make()
    used(queue)
    wait, waker = go_idle(loop, queue, ["default"], 3.0)
    pubsub = queue._pubsub
    with queue._listen_lock:
        queue._subscription_lost(pubsub, ConnectionError("dropped by another loop"))
    started = time.monotonic()
    assert wait.result(5) is None
    assert time.monotonic() - started < 2.0
    waker.close()


def test_a_wait_begun_while_the_subscription_is_down_ends_when_it_may_reopen(make, loop: ThreadPoolExecutor) -> None:  # type: ignore[no-untyped-def]
    # its blocking read sees pushes, but not a release, a retry or a reclaim
    queue = make()
    used(queue)
    waker = Waker()

    def idle_while_down() -> float:
        queue.reserve_many(["default"], 1)
        queue.wait_for_jobs(["default"], 0.2, waker)  # subscribes
        waker.clear()
        with queue._listen_lock:
            queue._subscription_lost(queue._pubsub, ConnectionError("dropped"))
        queue.reserve_many(["default"], 1)
        started = time.monotonic()
        queue.wait_for_jobs(["default"], 5.0, waker)
        return time.monotonic() - started

    assert loop.submit(idle_while_down).result(10) < 2.0, "the wait slept through its chance to subscribe again"
    waker.close()


def test_a_stopped_worker_leaves_no_blocking_read_behind(make, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    worker_side, producer = make(), make()
    used(worker_side)
    manager = QueueManager({"redis": worker_side}, registry=jobs.registry(), container=jobs.container(redis_url))
    worker = Worker(manager, options=WorkerOptions(concurrency=2, sleep=5))
    worker.start()
    wait_until(lambda: reading(worker_side), 5, message="the worker to idle in its blocking read")
    worker.stop()
    worker.join(5)
    pushed = job()
    producer.push(pushed)
    assert [j.id for j in producer.reserve_many(["default"], 8)] == [pushed.id], "no read of the stopped worker took it"
