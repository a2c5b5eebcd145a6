"""Messages that cannot be read as jobs: each moves alone to the failed queue,
with its reason, and the rest of its batch is handed out."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import pytest

from rainier_sync import QueuedJob, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers.sqs import SqsQueue
from tests.support import wait_until

from . import jobs
from .conftest import Queues
from .jobs import Note
from .test_driver import job

pytestmark = pytest.mark.sqs

DEEP = "[" * 100_000 + "]" * 100_000


def envelope(**changes: Any) -> str:
    wire = job(tries=3).to_wire()
    wire.update(changes)
    return json.dumps(wire)


def take(q: SqsQueue, limit: int = 10) -> list[QueuedJob]:
    return q.reserve_many(["default"], limit)


def discarded_while(q: SqsQueue, bodies: list[str], good: int = 2) -> tuple[list[QueuedJob], list[dict[str, Any]]]:
    """Send ``bodies`` and ``good`` jobs, take one batch; the jobs handed out and the discards announced."""
    for body in bodies:
        q.client.send_message(QueueUrl=q.queue_urls["default"], MessageBody=body)
    pushed = [job() for _ in range(good)]
    q.push_many(pushed)
    announced: list[dict[str, Any]] = []
    with signals.queue_message_discarded.connected_to(lambda sender, **kw: announced.append(kw)):
        taken = take(q)
    assert sorted(j.id for j in taken) == sorted(j.id for j in pushed), "the rest of the batch is handed out"
    return taken, announced


def test_a_message_nested_100000_deep_is_failed_alone_and_deleted(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    deep_job = '{"id":"deep","name":"tests.sqs.note","queue":"default","payload":{"a":' + DEEP + "}}"
    taken, announced = discarded_while(q, [DEEP, deep_job])
    assert sorted(len(a["raw"]) for a in announced) == sorted([len(DEEP), len(deep_job)])
    assert all("nested too deeply" in a["error"] for a in announced), [a["error"] for a in announced]
    q.acknowledge_many(taken)
    # Deleted from its queue, not left to reappear every visibility timeout.
    assert q.counts("default").total == 0
    failed = q.failed_jobs()
    assert sorted(len(f.payload["raw"]) for f in failed) == sorted([len(DEEP), len(deep_job)])
    assert all(f.name == "(unreadable message)" and "nested too deeply" in f.error for f in failed)
    q.close()


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"attempts": -5}, "attempts"),
        ({"attempts": 10**12}, "attempts"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -1}, "max_attempts"),
        ({"max_attempts": 10**12}, "max_attempts"),
    ],
)
def test_a_negative_or_absurd_attempt_count_is_unreadable_and_said_so(
    queues: Queues, changes: dict[str, Any], reason: str
) -> None:
    q = queues.driver(visibility_timeout=30)
    body = envelope(**changes)
    taken, announced = discarded_while(q, [body], good=1)
    assert [a["raw"] for a in announced] == [body]
    assert reason in announced[0]["error"] and str(next(iter(changes.values()))) in announced[0]["error"]
    q.acknowledge_many(taken)
    assert q.counts("default").total == 0
    (failed,) = q.failed_jobs()
    assert failed.payload["raw"] == body and reason in failed.error
    q.close()


@pytest.mark.parametrize(
    "body",
    [
        '{"id":"x","name":"n","payload":{},"attempts":1e400}',  # int(inf): OverflowError
        '{"id":"x","name":"n","payload":{},"available_at":1e400}',  # due never: would hop for ever
        '{"id":"x","name":"n","payload":{},"available_at":NaN}',
        '{"id":"x","name":"n","payload":{},"dispatched_at":"soon"}',
        '{"id":"x","name":"n"}',  # missing fields
        "[1, 2, 3]",  # unknown shape
        "",
    ],
)
def test_any_failure_to_read_a_message_fails_it_alone(queues: Queues, body: str) -> None:
    q = queues.driver(visibility_timeout=30)
    if not body:
        body = " "  # SQS refuses an empty body
    taken, announced = discarded_while(q, [body], good=2)
    assert [a["raw"] for a in announced] == [body] and announced[0]["error"]
    q.acknowledge_many(taken)
    assert q.counts("default").total == 0
    assert [f.payload["raw"] for f in q.failed_jobs()] == [body]
    q.close()


def test_an_unexpected_exception_while_reading_fails_only_that_message(
    queues: Queues, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = QueuedJob.decode.__func__  # type: ignore[attr-defined]

    def decode(cls: type[QueuedJob], text: str, **kwargs: Any) -> QueuedJob:
        if "surprise" in text:
            raise LookupError("a decoder bug")
        return real(cls, text, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(QueuedJob, "decode", classmethod(decode))
    q = queues.driver(visibility_timeout=30)
    body = envelope(payload={"surprise": True})
    taken, announced = discarded_while(q, [body], good=2)
    assert [a["raw"] for a in announced] == [body]
    assert "LookupError: a decoder bug" in announced[0]["error"]
    q.acknowledge_many(taken)
    assert q.counts("default").total == 0
    q.close()


def test_a_deep_message_sqs_moved_to_the_failed_queue_is_listed(queues: Queues) -> None:
    # A RedrivePolicy may put anything in the failed queue: listing it must not fail.
    q = queues.driver(visibility_timeout=30)
    q.client.send_message(QueueUrl=q.failed_queue_url, MessageBody=DEEP)
    (failed,) = q.failed_jobs()
    assert failed.name == "(unreadable message)" and len(failed.payload["raw"]) == len(DEEP)
    assert q.forget_failed(failed.id) is True
    q.close()


def test_an_unreadable_message_too_big_to_store_whole_keeps_its_beginning(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    body = '"' * 1_000_000  # each quote doubles once escaped in the failed entry: past SQS's limit
    taken, announced = discarded_while(q, [body], good=1)
    assert [len(a["raw"]) for a in announced] == [len(body)]
    q.acknowledge_many(taken)
    assert q.counts("default").total == 0
    (failed,) = q.failed_jobs()
    assert failed.name == "(unreadable message)" and body.startswith(failed.payload["raw"])
    assert len(failed.payload["raw"]) > 300_000


def test_bad_messages_on_every_queue_fail_alone_with_their_reasons_and_every_good_job_runs(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    visibility = 30
    names = ("high", "default", "low")
    q = queues.driver(queues=("high", "low"), visibility_timeout=visibility)
    manager = manager_for(q)
    reasons = {
        "not JSON": "not valid JSON",
        "unknown NAME": "UnknownJobError",
        "deep": "nested too deeply",
        "missing fields": "no 'payload' field",
        "negative attempts": "attempts -5",
    }
    sent: dict[str, list[str]] = {what: [] for what in reasons}
    for queue in names:
        bodies = {
            "not JSON": "{'this': is not json " + queue,
            "unknown NAME": envelope(name="tests.sqs.nobody", queue=queue),
            "deep": DEEP,
            "missing fields": json.dumps({"id": f"m-{queue}", "name": "tests.sqs.note", "queue": queue}),
            "negative attempts": envelope(attempts=-5, queue=queue),
        }
        for what, body in bodies.items():
            q.client.send_message(QueueUrl=q.url_of(queue), MessageBody=body)
            sent[what].append(body)
        for i in range(3):
            manager.dispatch_on(queue, Note(tag=f"{queue}{i}"))
    start = time.monotonic()
    worker = Worker(manager, options=WorkerOptions(queues=list(names), concurrency=2, sleep=0.2))
    worker.start()
    try:
        # Well inside one visibility timeout: nothing is left to reappear.
        wait_until(
            lambda: len(ran_tags()) == 9 and q.failed_count() == 15,
            timeout=visibility - 5,
            interval=0.2,
            message="every good job run and every bad one failed",
        )
    finally:
        worker.stop()
        worker.join(timeout=10)
    assert time.monotonic() - start < visibility
    assert sorted(ran_tags()) == sorted(f"{queue}{i}" for queue in names for i in range(3))
    failed = q.failed_jobs(50)
    assert len(failed) == 15
    for what, reason in reasons.items():
        if what == "unknown NAME":
            found = [f for f in failed if f.name == "tests.sqs.nobody"]
        else:
            found = [f for f in failed if f.payload.get("raw") in sent[what]]
        assert len(found) == 3, (what, [f.error for f in found])
        assert all(reason in f.error for f in found), (what, [f.error for f in found])
    assert all(q.counts(queue).total == 0 for queue in names)


def ran_tags() -> list[str]:
    with jobs.lock:
        return [tag for tag, _ in jobs.runs]
