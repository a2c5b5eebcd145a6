"""give_back: jobs received and never started (or interrupted by a stopping
worker) go back at once without spending a try, although SQS counts every receive."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rainier_sync import QueuedJob
from rainier_sync.drivers.sqs import SqsBatchError

from .conftest import Queues, count_calls
from .test_driver import job, reserve_eventually

pytestmark = pytest.mark.sqs


def test_a_tries_1_job_given_back_is_handed_out_again_not_failed(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    pushed = job(tries=1, unique="k1")
    q.push(pushed)
    got = reserve_eventually(q, ["default"])
    q.give_back([got])
    # At once (not after the 30 s visibility timeout), and with the same attempts.
    again = q.reserve_many(["default"], 5)
    assert [(j.id, j.attempts) for j in again] == [(pushed.id, 1)]
    assert again[0].payload == pushed.payload and again[0].unique_key == "k1"
    q.acknowledge_many(again)
    assert q.failed_count() == 0 and q.counts("default").total == 0
    q.close()


def test_a_job_given_back_keeps_the_attempts_it_had(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    q.push(job(tries=5))
    first = reserve_eventually(q, ["default"])
    q.release(first, 0)  # attempt 1 ran and failed: that one counts
    second = reserve_eventually(q, ["default"])
    assert second.attempts == 2
    q.give_back([second])
    third = reserve_eventually(q, ["default"])
    assert third.attempts == 2, "the attempt handed back was not spent"
    q.give_back([third])
    assert reserve_eventually(q, ["default"]).attempts == 2
    q.close()


def test_give_back_sends_and_deletes_ten_per_call(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    pushed = [job(tries=1) for _ in range(15)]
    q.push_many(pushed)
    taken: list[QueuedJob] = []
    while len(taken) < 15:
        taken.extend(q.reserve_many(["default"], 15 - len(taken)))
    calls = count_calls(q.client)
    q.give_back(taken)
    assert calls == {"SendMessageBatch": 2, "DeleteMessageBatch": 2}
    counts = q.counts("default")
    assert (counts.ready, counts.reserved) == (15, 0)
    again: list[QueuedJob] = []
    while len(again) < 15:
        again.extend(q.reserve_many(["default"], 15 - len(again)))
    assert sorted(j.id for j in again) == sorted(j.id for j in pushed) and {j.attempts for j in again} == {1}
    q.close()


def _delete_batch_fails_once(q: Any) -> None:
    real = q.client.delete_message_batch
    state = {"failed": False}

    def delete(**params: Any) -> Any:
        if not state["failed"]:
            state["failed"] = True
            raise ConnectionError("lost on the way")
        return real(**params)

    q.client.delete_message_batch = delete


def test_a_give_back_repeated_after_its_delete_failed_sends_one_copy(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=3)
    pushed = job(tries=1)
    q.push(pushed)
    got = reserve_eventually(q, ["default"])
    _delete_batch_fails_once(q)
    with pytest.raises(ConnectionError):
        q.give_back([got])
    q.give_back([got])  # the worker tries again
    again = reserve_eventually(q, ["default"])
    assert (again.id, again.attempts) == (pushed.id, 1)
    q.acknowledge_many([again])
    time.sleep(3.5)  # past the visibility timeout: a second copy, or the original, would be back
    assert q.reserve_many(["default"], 5) == [] and q.counts("default").total == 0
    q.close()


def test_a_give_back_whose_copy_was_refused_deletes_nothing_and_raises(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    q.push_many([job(tries=1), job(tries=1)])
    taken: list[QueuedJob] = []
    while len(taken) < 2:
        taken.extend(q.reserve_many(["default"], 2))
    real = q.client.send_message_batch
    refused_id = taken[1].id

    def second_refused(**params: Any) -> Any:
        entries = [e for e in params["Entries"] if refused_id not in e["MessageBody"]]
        refused = [e for e in params["Entries"] if refused_id in e["MessageBody"]]
        response = real(**{**params, "Entries": entries}) if entries else {}
        response.setdefault("Failed", []).extend(
            {"Id": e["Id"], "Code": "InternalError", "Message": "try later", "SenderFault": False} for e in refused
        )
        return response

    q.client.send_message_batch = second_refused
    with pytest.raises(SqsBatchError):
        q.give_back(taken)
    assert q.counts("default").reserved == 2, "no original is deleted while a copy is missing"
    q.client.send_message_batch = real
    q.give_back(taken)  # the retry sends only the missing copy
    again: list[QueuedJob] = []
    while len(again) < 2:
        again.extend(q.reserve_many(["default"], 5))
    assert sorted(j.id for j in again) == sorted(j.id for j in taken) and {j.attempts for j in again} == {1}
    assert q.reserve_many(["default"], 5) == [] and q.counts("default").total == 2
    q.close()


def test_a_job_given_back_after_its_reservation_lapsed_is_not_copied(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    q.push(job(tries=3))
    got = reserve_eventually(q, ["default"])
    time.sleep(1.2)  # lapsed: SQS may have handed it to another worker
    other = reserve_eventually(q, ["default"])
    assert other.attempts == 2
    q.give_back([got])
    q.acknowledge_many([other])
    assert q.counts("default").total == 0, "no copy beside the run that holds it now"
    q.close()


def test_a_fifo_job_given_back_keeps_its_place_in_its_group(queues: Queues) -> None:
    q = queues.driver(fifo=True, visibility_timeout=30)
    pushed = [job(tries=3) for _ in range(3)]
    q.push_many(pushed)
    first = reserve_eventually(q, ["default"])
    assert first.id == pushed[0].id
    q.give_back([first])
    order: list[QueuedJob] = []
    while len(order) < 3:
        got = q.reserve_many(["default"], 1)
        q.acknowledge_many(got)
        order.extend(got)
    assert [j.id for j in order] == [j.id for j in pushed]
    # A FIFO queue keeps the order, and SQS counts the receive (documented).
    assert order[0].attempts == 2
    q.close()
