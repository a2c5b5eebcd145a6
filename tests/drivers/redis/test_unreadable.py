"""Stream entries nobody can read: each goes alone to the failed store, with its
reason, and the jobs claimed with it are handed out in the same claim."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rainier_sync import QueuedJob, signals
from rainier_sync.drivers import RedisQueue
from rainier_sync.errors import PayloadError
from tests.support import wait_until

from .test_driver import go_idle, job, stream, used

pytestmark = pytest.mark.redis

DEEP = 100_000


def envelope(payload: str = '{"x":1}', **fields: str) -> str:
    base = {"id": '"bad-1"', "name": '"redis-tests.plain"', "queue": '"default"', "payload": payload}
    base.update(fields)
    return "{" + ",".join(f'"{k}":{v}' for k, v in base.items()) + "}"


#: kind -> (the entry's fields, a word its reason names)
BAD: dict[str, tuple[dict[str, str], str]] = {
    "not JSON": ({"j": "{not json", "a": "0"}, "not valid JSON"),
    "no job field": ({"something": "else"}, "no 'j'"),
    "envelope missing fields": ({"j": '{"id":"x","queue":"default"}', "a": "0"}, "no 'name' field"),
    "nested 100,000 deep": (
        {"j": envelope(payload='{"deep":' + "[" * DEEP + "]" * DEEP + "}"), "a": "0"},
        "nested too deeply",
    ),
    "negative attempts": ({"j": envelope(), "a": "-1"}, "attempts"),
    "attempts not a number": ({"j": envelope(), "a": "abc"}, "attempts"),
    "attempts beyond any count": ({"j": envelope(), "a": "9" * 5000}, "attempts"),
}


@pytest.fixture
def heard() -> Iterator[list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    def on_discarded(sender: object, **kwargs: Any) -> None:
        got.append(kwargs)

    signals.queue_message_discarded.connect(on_discarded)
    yield got
    signals.queue_message_discarded.disconnect(on_discarded)


@pytest.fixture
def make(redis_url: str, prefix: str) -> Iterator[Any]:
    made: list[RedisQueue] = []

    def build(**options: Any) -> RedisQueue:
        queue = RedisQueue.from_url(redis_url, prefix=prefix, **options)
        made.append(queue)
        return queue

    yield build
    for queue in made:
        queue.close()


def goods(n: int, start: int = 0) -> list[QueuedJob]:
    return [job(n=k) for k in range(start, start + n)]


def assert_discarded_alone(
    queue: RedisQueue, heard: list[dict[str, Any]], reasons: list[str], redis_client: Any, prefix: str, left: int
) -> None:
    failed = queue.failed_jobs(50)
    assert [f.name for f in failed] == ["<unreadable>"] * len(reasons)
    errors = sorted(f.error.lower() for f in failed)
    for reason in reasons:
        assert any(reason.lower() in error for error in errors), (reason, errors)
    assert len(heard) == len(reasons)
    assert redis_client.xlen(stream(prefix)) == left, "only the unreadable entries left the stream"


@pytest.mark.parametrize("kind", list(BAD))
def test_an_unreadable_entry_goes_alone_to_the_failed_store_and_its_batch_is_handed_out(
    kind: str, make: Any, heard: list[dict[str, Any]], redis_client: Any, prefix: str
) -> None:
    fields, reason = BAD[kind]
    queue = make(reservation=30)
    before, after = goods(13), goods(14, start=13)
    queue.push_many(before)
    redis_client.xadd(stream(prefix), fields)
    queue.push_many(after)
    got = queue.reserve_many(["default"], 28)  # one claim: 27 good jobs and the bad one
    assert [j.payload["n"] for j in got] == list(range(27)), "every good job claimed with it is handed out"
    assert all(j.attempts == 1 for j in got)
    assert_discarded_alone(queue, heard, [reason], redis_client, prefix, left=27)
    assert redis_client.zcard(prefix + "default:reserved") == 27, "the bad entry holds no reservation"
    assert redis_client.xpending(stream(prefix), "rainier")["pending"] == 27
    assert reason.lower() in str(heard[0]["error"]).lower()
    assert heard[0]["raw"], "the raw entry goes with the announcement"


def test_unreadable_entries_put_back_by_the_xautoclaim_net_are_discarded_there_after(
    make: Any, heard: list[dict[str, Any]], redis_client: Any, prefix: str
) -> None:
    # a consumer that died after reading them: pending, with no reservation on record
    queue = make(reservation=0.5)
    used(queue)
    for n, (fields, _) in enumerate(BAD.values()):
        queue.push(job(n=n))
        redis_client.xadd(stream(prefix), fields)
    redis_client.xreadgroup("rainier", "ghost", {stream(prefix): ">"}, count=100)
    wait_until(lambda: queue.reclaim_expired() > 0, timeout=10, interval=0.1, message="the net to put them back")
    got = queue.reserve_many(["default"], 100)
    assert sorted(j.payload["n"] for j in got) == list(range(len(BAD)))
    assert_discarded_alone(queue, heard, [reason for _, reason in BAD.values()], redis_client, prefix, left=len(BAD))


@pytest.mark.parametrize("kind", list(BAD))
def test_an_unreadable_entry_the_blocking_read_took_is_discarded_and_the_reserve_carries_on(
    kind: str, make: Any, heard: list[dict[str, Any]], redis_client: Any, prefix: str
) -> None:
    fields, reason = BAD[kind]
    worker_side = make(reservation=30)
    used(worker_side)
    with ThreadPoolExecutor(1) as loop:
        wait, waker = go_idle(loop, worker_side, ["default"], 5.0)
        redis_client.xadd(stream(prefix), fields)
        wait.result(5)
        assert len(next(iter(worker_side._all_reads)).stash) == 1, "the read took it"
        worker_side.push_many(goods(3))
        got = loop.submit(worker_side.reserve_many, ["default"], 8).result(10)
        loop.submit(worker_side._sync).result(5)
        waker.close()
    assert [j.payload["n"] for j in got] == [0, 1, 2]
    assert_discarded_alone(worker_side, heard, [reason], redis_client, prefix, left=3)
    assert redis_client.zcard(prefix + "default:reserved") == 3


def test_a_deep_entry_in_the_failed_store_is_listed_and_retried_as_it_came(
    make: Any, heard: list[dict[str, Any]], redis_client: Any, prefix: str
) -> None:
    fields, _ = BAD["nested 100,000 deep"]
    queue = make(reservation=30)
    queue.push(job(n=0))
    redis_client.xadd(stream(prefix), fields)
    assert [j.payload["n"] for j in queue.reserve_many(["default"], 8)] == [0]
    (failed,) = queue.failed_jobs()
    assert failed.name == "<unreadable>" and "nested too deeply" in failed.error.lower()
    assert queue.retry_failed(failed.id)
    assert queue.failed_count() == 0
    found = redis_client.xrange(stream(prefix))
    assert found[-1][1][b"j"] == fields["j"].encode(), "back on its stream byte for byte"
    queue.push(job(n=1))
    assert [j.payload["n"] for j in queue.reserve_many(["default"], 8)] == [1]
    assert queue.failed_count() == 1 and len(heard) == 2


def test_a_failed_record_nobody_can_read_is_listed_not_raised_and_its_retry_is_refused(
    make: Any, redis_client: Any, prefix: str
) -> None:
    queue = make(reservation=30)
    deep = '{"job":' + "[" * DEEP + "]" * DEEP + "}"
    redis_client.hset(prefix + "failed", "corrupt", deep)
    redis_client.zadd(prefix + "failed:index", {"corrupt": time.time()})
    queue.push(job())
    got = queue.reserve(["default"])
    assert got is not None
    queue.fail(got, "boom")
    listed = queue.failed_jobs()
    assert sorted(f.id for f in listed) == sorted(["corrupt", got.id])
    (corrupt,) = [f for f in listed if f.id == "corrupt"]
    assert corrupt.name == "<unreadable>" and "unreadable" in corrupt.error
    with pytest.raises(PayloadError, match="corrupt"):
        queue.retry_failed("corrupt")
    assert queue.retry_failed(got.id), "the readable one beside it retries"

