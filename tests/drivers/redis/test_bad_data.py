"""Data Redis cannot be sent is refused with PayloadError naming what is at fault,
never a redis-py error; nothing of a refused batch is stored, and the connection
is left clean for the next command."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from rainier_sync import QueuedJob
from rainier_sync.drivers import RedisQueue
from rainier_sync.errors import PayloadError
from rainier_sync.locks import RedisLockStore

from .test_driver import job, stream

pytestmark = pytest.mark.redis

LONE = "\ud800"


@pytest.fixture
def queue(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    made = RedisQueue.from_url(redis_url, prefix=prefix, reservation=30)
    yield made
    made.close()


def bad(kind: str) -> QueuedJob:
    made = job(n=1)
    made.id = f"bad-{kind.replace(' ', '-')}"
    if kind == "lone surrogate in the payload":
        made.payload = {"text": "a" + LONE}
    elif kind == "lone surrogate in the queue name":
        made.queue = "q" + LONE
    elif kind == "priority beyond a double":
        made.priority = 10**400
    elif kind == "due time not a number":
        made.available_at = math.nan
    elif kind == "payload JSON cannot hold":
        made.payload = {"when": object()}
    return made


KINDS = [
    "lone surrogate in the payload",
    "lone surrogate in the queue name",
    "priority beyond a double",
    "due time not a number",
    "payload JSON cannot hold",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_redis_cannot_be_sent_is_refused_naming_it(kind: str, queue: RedisQueue) -> None:
    refused = bad(kind)
    with pytest.raises(PayloadError, match=refused.id):
        queue.push(refused)
    with pytest.raises(PayloadError, match=refused.id):
        queue.push_many([job(n=k) for k in range(1500)] + [refused] + [job(n=k) for k in range(500)])
    assert queue.size("default") == 0, "nothing of the refused batch was stored"
    queue.push(job(n=2))  # the connection holds no stray reply
    (got,) = queue.reserve_many(["default"], 8)
    assert got.payload == {"n": 2}


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.reserve_many(["q" + LONE], 1),
        lambda q: q.counts("q" + LONE),
        lambda q: q.size("q" + LONE),
        lambda q: q.retry_failed("id" + LONE),
        lambda q: q.forget_failed("id" + LONE),
        lambda q: q.forget_failed({"not": "an id"}),
    ],
    ids=["reserve_many", "counts", "size", "retry_failed", "forget_failed", "forget_failed of a dict"],
)
def test_arguments_redis_cannot_be_sent_are_a_payload_error(call: Any, queue: RedisQueue) -> None:
    with pytest.raises(PayloadError, match="redis connection 'default'"):
        call(queue)
    queue.push(job())
    assert len(queue.reserve_many(["default"], 8)) == 1, "the connections are still in step"


def test_a_stored_job_holding_a_lone_surrogate_escape_can_still_fail(
    queue: RedisQueue, redis_client: Any, prefix: str
) -> None:
    # "\ud800" is valid JSON: the job reads, runs, and its failure must be recordable
    queue.push(job())  # makes the stream
    queue.reserve_many(["default"], 1)
    envelope = {"id": "escaped", "name": "redis-tests.plain", "queue": "default", "payload": {"s": "\\ud800"}}
    redis_client.xadd(stream(prefix), {"j": json.dumps(envelope).replace("\\\\ud800", "\\ud800"), "a": "0"})
    (got,) = queue.reserve_many(["default"], 1)
    assert got.payload == {"s": LONE}
    queue.fail(got, "boom")
    (failed,) = queue.failed_jobs()
    assert failed.id == "escaped" and failed.payload == {"s": LONE}
    assert queue.retry_failed("escaped")
    (again,) = queue.reserve_many(["default"], 1)
    assert again.payload == {"s": LONE}


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.acquire("k" + LONE, "me", 30),
        lambda s: s.acquire("k", "me" + LONE, 30),
        lambda s: s.acquire_many([("k", "me"), ("l" + LONE, "me")], 30),
        lambda s: s.release("k" + LONE, "me"),
        lambda s: s.renew("k", {"not": "an owner"}, 30),
        lambda s: s.owner("k" + LONE),
    ],
    ids=["acquire key", "acquire owner", "acquire_many", "release", "renew", "owner"],
)
def test_a_lock_redis_cannot_be_sent_is_a_payload_error(call: Any, redis_url: str, prefix: str) -> None:
    store = RedisLockStore.from_url(redis_url, prefix=prefix + "lock:")
    try:
        with pytest.raises(PayloadError, match="redis lock store"):
            call(store)
        assert store.acquire("k", "me", 30) and store.owner("k") == "me"
    finally:
        store.close()


def test_a_renewal_for_a_period_that_is_not_a_number_is_refused_naming_it(queue: RedisQueue) -> None:
    queue.push(job())
    held = queue.reserve_many(["default"], 1)
    with pytest.raises(ValueError, match="extend: seconds"):
        queue.extend(held, math.nan)
    queue.extend(held, 60)  # the connection is still in step
