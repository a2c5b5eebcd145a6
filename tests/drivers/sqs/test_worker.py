"""A Worker on an SQS connection: long polling, heartbeats, retries, unreadable messages."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from rainier_sync import QueueManager, Worker, WorkerOptions, signals
from tests.support import wait_until

from . import jobs
from .conftest import Queues, count_calls
from .jobs import Flaky, Note

pytestmark = pytest.mark.sqs


def ran(tag: str) -> list[int]:
    with jobs.lock:
        return [attempt for t, attempt in jobs.runs if t == tag]


def test_an_idle_worker_wakes_when_a_job_arrives_and_stops_promptly(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    # A long reservation spaces the worker's heartbeats out too, so nothing but the poll can wake it.
    # (Closing waits out a long poll in flight, so a longer one only slows the teardown.)
    q = queues.driver(wait_time=8, visibility_timeout=120)
    manager = manager_for(q)
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=30))
    worker.start()
    try:
        wait_until(lambda: worker.stats.idles >= 1, timeout=5, message="the worker to go idle")
        calls = count_calls(q.client, q._poll_client)
        manager.dispatch(Note(tag="wake"))
        # The worker sleeps up to 30 s and long-polls up to 8 s: only the poll answering wakes it this soon.
        wait_until(lambda: ran("wake") == [1], timeout=5, message="the job to run")
        assert calls.get("ReceiveMessage", 0) <= 3
    finally:
        worker.stop()
        stats = worker.join(timeout=5)
    assert not worker._thread.is_alive(), "a long poll in flight must not hold up stop()"  # type: ignore[union-attr]
    assert stats.processed == 1


def test_a_job_longer_than_its_visibility_timeout_runs_once(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    q = queues.driver(visibility_timeout=1)
    manager = manager_for(q)
    manager.dispatch(Note(tag="long", seconds=3.5))
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=3, sleep=0.2))
    worker.start()
    try:
        wait_until(lambda: worker.stats.processed == 1, timeout=15, message="the long job to finish")
        time.sleep(1.5)  # past one more visibility timeout: a lapsed reservation would show as a second run
    finally:
        worker.stop()
        worker.join(timeout=5)
    assert ran("long") == [1]
    assert q.size("default") == 0


def test_failed_attempts_are_released_then_succeed(queues: Queues, manager_for: Callable[..., QueueManager]) -> None:
    q = queues.driver()
    manager = manager_for(q)
    manager.dispatch(Flaky(tag="flaky", succeed_on=3))
    manager.dispatch(Flaky(tag="hopeless", succeed_on=99))
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=0.2))
    worker.start()
    try:
        wait_until(lambda: worker.stats.processed == 1 and worker.stats.failed == 1, timeout=15)
    finally:
        worker.stop()
        worker.join(timeout=5)
    assert ran("flaky") == [1, 2, 3]
    assert ran("hopeless") == [1, 2, 3]
    (failed,) = q.failed_jobs()
    assert failed.name == "tests.sqs.flaky" and failed.attempts == 3 and "attempt 3 fails" in failed.error
    assert q.size("default") == 0


def test_the_worker_goes_on_past_an_unreadable_message(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    q = queues.driver()
    manager = manager_for(q)
    discarded: list[dict[str, Any]] = []

    def on_discarded(sender: Any, **kw: Any) -> None:
        discarded.append(kw)

    q.client.send_message(QueueUrl=q.queue_urls["default"], MessageBody="\u2603 <xml/>")
    manager.dispatch(Note(tag="after"))
    signals.queue_message_discarded.connect(on_discarded)
    try:
        stats = Worker(manager, options=WorkerOptions(queues=["default"], once=True)).run()
    finally:
        signals.queue_message_discarded.disconnect(on_discarded)
    assert stats.processed == 1 and ran("after") == [1]
    assert [d["raw"] for d in discarded] == ["\u2603 <xml/>"]
    assert [f.payload["raw"] for f in q.failed_jobs()] == ["\u2603 <xml/>"]


def test_queues_are_drained_in_the_order_given(queues: Queues, manager_for: Callable[..., QueueManager]) -> None:
    q = queues.driver(queues=("high",))
    manager = manager_for(q)
    for i in range(5):
        manager.dispatch(Note(tag=f"low{i}"))
    for i in range(5):
        manager.dispatch_on("high", Note(tag=f"high{i}"))
    Worker(manager, options=WorkerOptions(queues=["high", "default"], concurrency=1, once=True)).run()
    with jobs.lock:
        order = [tag for tag, _ in jobs.runs]
    assert sorted(order[:5]) == [f"high{i}" for i in range(5)]
    assert sorted(order[5:]) == [f"low{i}" for i in range(5)]


def test_a_fifo_queue_runs_one_group_in_order_one_at_a_time(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    q = queues.driver(fifo=True, visibility_timeout=30)
    manager = manager_for(q)
    manager.dispatch_many([Note(tag=f"f{i}", seconds=0.05) for i in range(6)])
    stats = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=4, once=True)).run()
    assert stats.processed == 6
    with jobs.lock:
        assert [tag for tag, _ in jobs.runs] == [f"f{i}" for i in range(6)]
    assert q.size("default") == 0
