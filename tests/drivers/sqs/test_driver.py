"""SqsQueue against moto's SQS server: batching, attempts, delays, FIFO, the failed queue."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

import rainier_sync.drivers.sqs.wire as sqs_module
from rainier_sync import QueuedJob, QueueManager, Worker, WorkerOptions, _clock, signals
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.sqs import SqsBatchError, SqsQueue, UnknownQueueError
from rainier_sync.locks import MemoryLockStore
from tests.support import wait_until

from . import jobs
from .conftest import Queues, count_calls
from .jobs import Note

pytestmark = pytest.mark.sqs

_seq = 0


def job(queue: str = "default", *, delay: float = 0.0, tries: int = 3, unique: str | None = None) -> QueuedJob:
    global _seq
    _seq += 1
    now = _clock.now()
    queued = QueuedJob(
        id=f"j{_seq:05d}-{time.time_ns()}",
        name="tests.sqs.note",
        queue=queue,
        payload={"tag": str(_seq)},
        max_attempts=tries,
        available_at=now + delay,
        dispatched_at=now,
    )
    if unique is not None:
        queued.unique_key, queued.unique_owner, queued.unique_for = unique, "owner", 60.0
    return queued


def reserve_eventually(q: SqsQueue, queues: list[str], timeout: float = 8.0) -> QueuedJob:
    found: list[QueuedJob] = []
    wait_until(lambda: bool(found.extend(q.reserve_many(queues, 1)) or found), timeout=timeout, interval=0.05)
    return found[0]


def test_a_job_for_a_queue_without_a_url_is_refused_at_dispatch(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    q = queues.driver()
    manager = manager_for(q)
    with pytest.raises(UnknownQueueError, match=r"queue 'mail' has no SQS URL on connection 'sqs'.*queue_urls"):
        manager.dispatch_on("mail", Note(tag="x"))

    class MailNote(Note):
        NAME = "tests.sqs.mail-note"
        QUEUE = "mail"

    with pytest.raises(UnknownQueueError, match="'mail'"):
        manager.dispatch_many([Note(tag="fine"), MailNote(tag="nowhere")])
    assert q.size("default") == 0, "a refused dispatch sends nothing, not even to the default queue"
    with pytest.raises(UnknownQueueError):
        q.reserve_many(["mail"], 1)


def test_dispatch_many_sends_ten_per_call_and_receive_takes_ten(queues: Queues) -> None:
    q = queues.driver()
    calls = count_calls(q.client)
    jobs = [job() for _ in range(25)]
    assert q.push_many(jobs) == [j.id for j in jobs]
    assert calls == {"SendMessageBatch": 3}
    taken = q.reserve_many(["default"], 25)
    assert sorted(j.id for j in taken) == sorted(j.id for j in jobs)
    assert calls["ReceiveMessage"] == 3
    q.acknowledge_many(taken)
    assert calls["DeleteMessageBatch"] == 3
    assert q.size("default") == 0
    q.close()


def test_a_batch_entry_sqs_fails_for_a_passing_reason_is_retried(queues: Queues) -> None:
    # moto never fails one entry of a batch on its own; this wrapper makes it
    # answer like SQS under throttling, once, for one entry.
    q = queues.driver()
    real = q.client.send_message_batch
    seen: list[int] = []

    def flaky(**kwargs: Any) -> Any:
        entries = kwargs["Entries"]
        seen.append(len(entries))
        if len(seen) > 1:
            return real(**kwargs)
        response = real(**{**kwargs, "Entries": entries[1:]})
        response.setdefault("Failed", []).append(
            {"Id": entries[0]["Id"], "SenderFault": False, "Code": "InternalError", "Message": "try again"}
        )
        return response

    q.client.send_message_batch = flaky
    jobs = [job() for _ in range(4)]
    q.push_many(jobs)
    assert seen == [4, 1]
    assert sorted(j.id for j in q.reserve_many(["default"], 10)) == sorted(j.id for j in jobs)
    q.close()


def test_a_batch_entry_sqs_refuses_is_reported_by_job_id(queues: Queues) -> None:
    # As above: an entry refused as the sender's fault, as SQS would answer it.
    q = queues.driver()
    real = q.client.send_message_batch

    def refuse_first(**kwargs: Any) -> Any:
        entries = kwargs["Entries"]
        response = real(**{**kwargs, "Entries": entries[1:]})
        response.setdefault("Failed", []).append(
            {"Id": entries[0]["Id"], "SenderFault": True, "Code": "InvalidMessageContents", "Message": "bad"}
        )
        return response

    q.client.send_message_batch = refuse_first
    jobs = [job() for _ in range(3)]
    with pytest.raises(SqsBatchError) as caught:
        q.push_many(jobs)
    assert list(caught.value.failed) == [jobs[0].id]
    assert "InvalidMessageContents" in str(caught.value) and jobs[0].id in str(caught.value)
    assert sorted(caught.value.done) == sorted(j.id for j in jobs[1:])
    assert q.size("default") == 2
    q.close()


def test_attempts_count_releases_and_receives(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    q.push(job(tries=5))
    first = reserve_eventually(q, ["default"])
    assert first.attempts == 1
    q.release(first, 0)
    second = reserve_eventually(q, ["default"])
    assert second.attempts == 2
    # Never settled, as if its worker died: SQS hands it out again, and that counts.
    third = reserve_eventually(q, ["default"])
    assert (third.id, third.attempts) == (first.id, 3)
    q.close()


def test_a_job_received_after_its_final_attempt_is_handed_out_past_it(queues: Queues) -> None:
    # Its worker died on the last attempt: the driver hands it out counting that
    # attempt, and the executor fails it as lost rather than running it again.
    q = queues.driver(visibility_timeout=1)
    q.push(job(tries=2))
    assert reserve_eventually(q, ["default"]).attempts == 1  # its worker "dies"
    assert reserve_eventually(q, ["default"]).attempts == 2  # and again, on the last attempt
    lost = reserve_eventually(q, ["default"])
    assert (lost.attempts, lost.max_attempts) == (3, 2)
    assert q.failed_count() == 0, "the driver leaves it to the executor"
    q.close()


def test_a_worker_fails_a_job_whose_final_attempt_never_finished_as_lost(
    queues: Queues, manager_for: Callable[..., QueueManager]
) -> None:
    q = queues.driver(visibility_timeout=1)
    manager = manager_for(q)
    manager.dispatch(Note(tag="lost"))  # TRIES = 3
    for attempt in (1, 2, 3):
        assert reserve_eventually(q, ["default"]).attempts == attempt  # each worker "dies"
    failed_signals: list[dict[str, Any]] = []
    worker = Worker(manager, options=WorkerOptions(queues=["default"], sleep=0.2))
    with signals.job_failed.connected_to(lambda sender, **kw: failed_signals.append(kw)):
        worker.start()
        try:
            wait_until(lambda: worker.stats.failed == 1, timeout=10, message="the lost job to fail")
        finally:
            worker.stop()
            stats = worker.join(timeout=10)
    assert (stats.processed, stats.failed) == (0, 1) and not [t for t, _ in jobs.runs if t == "lost"]
    (failed,) = q.failed_jobs()
    assert failed.exception.crashed and "worker lost during attempt 3 of 3" in failed.error
    assert failed_signals and failed_signals[0]["exception"].crashed
    assert q.size("default") == 0
    q.close()


def test_a_long_delay_hops_and_never_arrives_early(queues: Queues, monkeypatch: pytest.MonkeyPatch) -> None:
    # SQS caps a message's delay at 15 minutes; the same path is shown with a 1 s cap.
    monkeypatch.setattr(sqs_module, "MAX_DELAY", 1)
    q = queues.driver()
    calls = count_calls(q.client)
    delayed = job(delay=2.2)
    q.push(delayed)
    got = reserve_eventually(q, ["default"], timeout=10)
    assert _clock.now() >= delayed.available_at, "handed out before it was due"
    assert got.id == delayed.id and got.attempts == 1, "a hop is not an attempt"
    assert calls["SendMessage"] >= 2, "the delay was longer than one message's delay can be"
    # A release longer than the cap is a re-send too; attempts carry over.
    q.release(got, 1.5)
    released_at = _clock.now()
    again = reserve_eventually(q, ["default"], timeout=10)
    assert _clock.now() >= released_at + 1.5
    assert (again.id, again.attempts) == (got.id, 2)
    q.close()


def test_counts_tell_ready_delayed_and_reserved(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    q.push_many([job(), job(), job(delay=60)])
    reserve_eventually(q, ["default"])
    counts = q.counts("default")
    assert (counts.ready, counts.delayed, counts.reserved) == (1, 1, 1)
    assert q.size() == 3
    q.close()


def test_unreadable_messages_are_discarded_to_the_failed_queue(queues: Queues) -> None:
    q = queues.driver()
    discarded: list[dict[str, Any]] = []

    def on_discarded(sender: Any, **kw: Any) -> None:
        discarded.append(kw)

    q.client.send_message(QueueUrl=q.queue_urls["default"], MessageBody="not json at all")
    q.client.send_message(QueueUrl=q.queue_urls["default"], MessageBody='{"no": "envelope"}')
    good = job()
    q.push(good)
    signals.queue_message_discarded.connect(on_discarded)
    try:
        taken: list[QueuedJob] = []
        wait_until(lambda: bool(taken.extend(q.reserve_many(["default"], 10)) or len(discarded) == 2), timeout=5)
        taken.extend(q.reserve_many(["default"], 10))
    finally:
        signals.queue_message_discarded.disconnect(on_discarded)
    assert [j.id for j in taken] == [good.id]
    assert sorted(d["raw"] for d in discarded) == sorted(['{"no": "envelope"}', "not json at all"])
    assert all(d["connection"] == q.connection and d["error"] for d in discarded)
    failed = q.failed_jobs()
    assert sorted(f.payload["raw"] for f in failed) == sorted(d["raw"] for d in discarded)
    assert all(f.name == "(unreadable message)" for f in failed)
    with pytest.raises(Exception, match="can only be forgotten"):
        q.retry_failed(failed[0].id)
    assert q.forget_failed(failed[0].id) is True
    assert len(q.failed_jobs()) == 1
    q.close()


def test_failed_jobs_lists_newest_first_past_one_receive(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    jobs = [job() for _ in range(23)]
    q.push_many(jobs)
    taken = []
    while len(taken) < 23:
        taken.extend(q.reserve_many(["default"], 10))
    for index, reserved in enumerate(taken):
        q.fail(reserved, f"broke #{index}")
    listed = q.failed_jobs(limit=100)
    assert len(listed) == 23 and q.failed_count() == 23
    assert [f.failed_at for f in listed] == sorted((f.failed_at for f in listed), reverse=True)
    assert listed[0].id == taken[-1].id
    assert q.failed_jobs(limit=5) == listed[:5]
    assert q.retry_failed(taken[3].id) is True
    assert q.failed_count() == 22
    again = reserve_eventually(q, ["default"])
    assert (again.id, again.attempts) == (taken[3].id, 1)
    q.close()


def test_a_job_sqs_moved_by_its_redrive_policy_is_listed_as_failed(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    arn = q.client.get_queue_attributes(QueueUrl=q.failed_queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    q.client.set_queue_attributes(
        QueueUrl=q.queue_urls["default"],
        Attributes={"RedrivePolicy": f'{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": "1"}}'},
    )
    pushed = job(tries=5)
    q.push(pushed)
    reserve_eventually(q, ["default"])  # received once, never settled: SQS moves it on the next receive
    wait_until(lambda: q.reserve_many(["default"], 1) == [] and q.failed_count() == 1, timeout=8, interval=0.2)
    (failed,) = q.failed_jobs()
    assert failed.id == pushed.id and "redrive policy" in failed.error
    assert q.retry_failed(pushed.id) is True
    q.client.set_queue_attributes(QueueUrl=q.queue_urls["default"], Attributes={"RedrivePolicy": ""})
    assert reserve_eventually(q, ["default"]).id == pushed.id
    q.close()


def test_fifo_queue_groups_by_job_name_and_dedups_unique_jobs(queues: Queues) -> None:
    q = queues.driver(fifo=True, visibility_timeout=30)
    first, second = job(), job()
    q.push_many([first, second])
    q.push(job(unique="tests.sqs.note:7"))
    q.push(job(unique="tests.sqs.note:7"))  # SQS drops it: same deduplication id
    assert q.size("default") == 3
    got = q.reserve_many(["default"], 10)
    assert [j.id for j in got] == [first.id], "one at a time: the next of a group waits for this one"
    assert q.reserve_many(["default"], 10) == [], "the group is locked while its job runs"
    q.acknowledge(got[0])
    assert [j.id for j in q.reserve_many(["default"], 10)] == [second.id]
    with pytest.raises(ValueError, match="FIFO queue.*no per-message delay"):
        q.push(job(delay=5))
    q.close()


def test_fifo_retry_of_a_failed_job_is_not_deduplicated_away(queues: Queues) -> None:
    q = queues.driver(fifo=True, visibility_timeout=30)
    pushed = job()
    q.push(pushed)
    got = q.reserve_many(["default"], 1)[0]
    q.fail(got, "no")
    assert q.retry_failed(pushed.id) is True
    assert [j.id for j in q.reserve_many(["default"], 1)] == [pushed.id]
    q.close()


def test_a_message_too_big_for_sqs_is_refused_naming_the_job(queues: Queues) -> None:
    q = queues.driver()
    big = job()
    big.payload = {"blob": "x" * 1_100_000}
    with pytest.raises(ValueError, match=rf"{big.id}.*SQS takes at most"):
        q.push_many([job(), big])
    assert q.size("default") == 0
    q.close()


def test_unique_jobs_through_the_manager(queues: Queues, manager_for: Callable[..., QueueManager]) -> None:
    q = queues.driver()
    manager = manager_for(q, locks=MemoryLockStore())

    class Once(Note):
        NAME = "tests.sqs.once"

        def unique_id(self) -> str | None:
            return self.tag

    manager.registry.register(Once)
    assert manager.dispatch(Once(tag="a")) is not None
    assert manager.dispatch(Once(tag="a")) is None
    assert q.size("default") == 1


def test_a_message_that_cannot_be_handled_costs_only_itself(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=30)
    q.client.delete_queue(QueueUrl=q.failed_queue_url)  # so the unreadable message has nowhere to go
    operations: list[dict[str, Any]] = []

    def on_failure(sender: Any, **kw: Any) -> None:
        operations.append(kw)

    q.client.send_message(QueueUrl=q.queue_urls["default"], MessageBody="garbage")
    good = [job(), job()]
    q.push_many(good)
    signals.queue_operation_failed.connect(on_failure)
    try:
        taken = q.reserve_many(["default"], 10)
    finally:
        signals.queue_operation_failed.disconnect(on_failure)
    assert sorted(j.id for j in taken) == sorted(j.id for j in good)
    assert [o["operation"] for o in operations] == ["reserve"]
    assert q.counts("default").reserved == 3, "the unreadable message stays on SQS, to be handled when it reappears"
    q.close()


def test_settling_with_a_receipt_that_no_longer_holds_its_message_does_not_raise(
    queues: Queues, caplog: pytest.LogCaptureFixture
) -> None:
    q = queues.driver(visibility_timeout=30)
    q.push(job())
    got = reserve_eventually(q, ["default"])
    q.acknowledge(got)
    q.release(got, 0)  # SQS answers ReceiptHandleIsInvalid: logged, or the worker would retry it forever
    q.acknowledge(got)
    assert "its message is gone" in caplog.text
    assert q.size("default") == 0
    q.close()


def test_a_message_a_long_poll_brought_in_is_handed_back_uncounted_on_close(queues: Queues) -> None:
    from rainier_sync.drivers.base import Waker

    first = queues.driver(wait_time=5, visibility_timeout=30)
    waker = Waker()
    first.wait_for_jobs(["default"], 0, waker)  # starts the long poll and returns at once
    pushed = job(tries=1)
    first.push(pushed)
    wait_until(lambda: bool(first._buffer), timeout=5, message="the long poll to bring the job in")
    first.close()
    waker.close()
    second = SqsQueue(
        first.queue_urls["default"],
        failed_queue_url=first.failed_queue_url,
        endpoint=queues.endpoint,
        region="us-east-1",
        key="testing",
        secret="testing",
    )
    got = reserve_eventually(second, ["default"])
    assert (got.id, got.attempts) == (pushed.id, 1), "a receive that ran nothing is not an attempt"
    second.close()


def test_a_ready_client_can_be_given(queues: Queues, sqs_client: Any) -> None:
    q = SqsQueue(queues.create("default"), failed_queue_url=queues.create("failed"), client=sqs_client)
    assert q.region == "us-east-1"
    pushed = job()
    q.push(pushed)
    assert reserve_eventually(q, ["default"]).id == pushed.id
    q.close()
    assert sqs_client.list_queues() is not None, "a client the driver was given is not closed by it"


def test_a_send_to_a_queue_that_is_gone_names_the_job_and_queue(queues: Queues) -> None:
    q = queues.driver()
    q.client.delete_queue(QueueUrl=q.queue_urls["default"])
    lost = job()
    with pytest.raises(Exception) as caught:
        q.push(lost)
    assert any(lost.id in note and "'default'" in note for note in caught.value.__notes__)
    with pytest.raises(Exception) as caught:
        q.push_many([job(), job()])
    assert any("2 job(s) to queue 'default'" in note for note in caught.value.__notes__)
    q.close()


def test_a_receive_failing_after_a_batch_was_taken_hands_out_what_was_taken(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=2)
    q.push_many([job(tries=1) for _ in range(15)])
    real = q.client.receive_message
    calls = {"n": 0}

    def second_fails(**params: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("network blip")
        return real(**params)

    q.client.receive_message = second_fails
    reported: list[Any] = []
    with signals.queue_operation_failed.connected_to(lambda sender, **kw: reported.append(kw)):
        got = q.reserve_many(["default"], 15)
    q.client.receive_message = real
    # The first ten were received: they are handed out, not left to lapse and
    # come back as an attempt that never ran (failing these TRIES=1 jobs unrun).
    assert len(got) == 10 and all(j.attempts == 1 for j in got)
    assert reported and "network blip" in reported[0]["error"]
    q.acknowledge_many(got)
    rest: list[QueuedJob] = []
    wait_until(lambda: bool(rest.extend(q.reserve_many(["default"], 15)) or len(rest) >= 5), timeout=8)
    assert len(rest) == 5 and q.failed_jobs(20) == []


def test_a_receive_failing_with_nothing_taken_raises(queues: Queues) -> None:
    q = queues.driver()

    def fails(**params: Any) -> Any:
        raise ConnectionError("network down")

    q.client.receive_message = fails
    with pytest.raises(ConnectionError, match="network down"):
        q.reserve_many(["default"], 5)


def test_a_held_message_goes_only_to_a_reserve_for_its_queue(queues: Queues) -> None:
    q = queues.driver(queues=("other",), visibility_timeout=5)
    q.push(job("other"))
    waker = Waker()
    try:
        q.wait_for_jobs(["other"], 3.0, waker)  # a long poll on "other" brings it in
        assert waker.is_set()
        assert q.reserve_many(["default"], 5) == []
        got = q.reserve_many(["other"], 5)
        assert [j.queue for j in got] == ["other"]
        q.acknowledge_many(got)
    finally:
        waker.close()
        q.close()


def test_a_message_handed_back_at_close_keeps_its_earlier_attempts(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=5)
    q.push(job(tries=2))
    first = q.reserve_many(["default"], 1)[0]
    assert first.attempts == 1
    q.release(first, 0)  # attempt 1 failed; retry at once
    waker = Waker()
    try:
        q.wait_for_jobs(["default"], 3.0, waker)  # a long poll holds it ...
        assert waker.is_set()
    finally:
        waker.close()
    q.close()  # ... and hands it back
    r = SqsQueue(
        q.queue_urls["default"],
        failed_queue_url=q.failed_queue_url,
        endpoint=queues.endpoint,
        region="us-east-1",
        key="testing",
        secret="testing",
        visibility_timeout=5,
        wait_time=1,
    )
    try:
        again = reserve_eventually(r, ["default"])
        assert again.attempts == 2  # not 1: TRIES=2 must not grant a third run
        r.acknowledge(again)
    finally:
        r.close()


def test_fail_after_the_reservation_lapsed_stores_no_second_copy(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    q.push(job(tries=1))
    mine = q.reserve_many(["default"], 1)[0]
    time.sleep(1.5)
    # Another receive takes it: attempt 2 of 1, which that worker's executor fails as lost.
    theirs = q.reserve_many(["default"], 1)
    assert [j.attempts for j in theirs] == [2]
    q.fail(mine, "boom")  # the lapsed worker's own fail, too late: it stores nothing
    q.fail(theirs[0], "worker lost during attempt 1 of 1")
    assert [e.error for e in q.failed_jobs(10)] == ["Error: worker lost during attempt 1 of 1"]


def test_a_long_release_after_the_reservation_lapsed_sends_no_copy(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    q.push(job(tries=3))
    mine = q.reserve_many(["default"], 1)[0]
    time.sleep(1.5)
    theirs = q.reserve_many(["default"], 1)[0]  # another worker's attempt 2
    assert theirs.attempts == 2
    q.release(mine, 1000)  # the lapsed worker's retry, past 15 minutes
    q.extend([theirs], 5)
    q.acknowledge(theirs)  # attempt 2 succeeded
    wait_until(lambda: q.counts("default").total == 0, timeout=3)
    time.sleep(0.5)
    assert q.counts("default").total == 0  # no later copy to run it again


def test_a_lapsed_release_changes_nothing(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    q.push(job(tries=3))
    mine = q.reserve_many(["default"], 1)[0]
    time.sleep(1.5)
    theirs = q.reserve_many(["default"], 1)[0]
    q.extend([theirs], 5)
    calls = count_calls(q.client)
    q.release(mine, 0)  # would make the message another worker runs visible
    assert calls.get("ChangeMessageVisibility", 0) == 0
    assert q.reserve_many(["default"], 1) == []
    q.acknowledge(theirs)


def test_a_held_message_renewed_by_the_heartbeat_is_still_handed_out(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=2)
    q.push(job(tries=1))
    waker = Waker()
    try:
        q.wait_for_jobs(["default"], 3.0, waker)  # a long poll holds it while the worker is busy
        assert waker.is_set()
    finally:
        waker.close()
    for _ in range(3):  # the busy worker's heartbeat renews held messages too
        time.sleep(0.6)
        q.extend([])
    # Dropped as stale, it would come back as attempt 2 of 1 and fail unrun.
    got = q.reserve_many(["default"], 1)
    assert [j.attempts for j in got] == [1]
    q.acknowledge_many(got)
    assert q.failed_jobs(5) == []


def _delete_fails_once(q: SqsQueue) -> None:
    real = q.client.delete_message
    state = {"failed": False}

    def delete(**params: Any) -> Any:
        if not state["failed"]:
            state["failed"] = True
            raise ConnectionError("delete lost")
        return real(**params)

    q.client.delete_message = delete


def test_a_long_release_repeated_after_its_delete_failed_sends_one_copy(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=5)
    q.push(job(tries=3))
    mine = q.reserve_many(["default"], 1)[0]
    _delete_fails_once(q)
    with pytest.raises(ConnectionError):
        q.release(mine, 1000)
    q.release(mine, 1000)  # the worker retries the settle
    wait_until(lambda: q.counts("default").reserved == 0, timeout=3)
    assert q.counts("default").delayed == 1


def test_a_fail_repeated_after_its_delete_failed_stores_one_entry(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=5)
    q.push(job(tries=1))
    mine = q.reserve_many(["default"], 1)[0]
    _delete_fails_once(q)
    with pytest.raises(ConnectionError):
        q.fail(mine, "boom")
    q.fail(mine, "boom")  # the worker retries the settle
    assert [f.error for f in q.failed_jobs(10)] == ["Error: boom"]


def test_a_hop_whose_delete_failed_is_not_sent_twice(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=1)
    later = job(delay=2000)
    q.client.send_message(QueueUrl=q.queue_urls["default"], MessageBody=later.encode())  # as a hop leaves it
    _delete_fails_once(q)
    assert q.reserve_many(["default"], 1) == []  # hopped; the delete of the original failed
    time.sleep(1.3)  # the original comes back
    assert q.reserve_many(["default"], 1) == []
    wait_until(lambda: q.counts("default").ready + q.counts("default").reserved == 0, timeout=3)
    assert q.counts("default").delayed == 1


def test_a_held_message_nobody_takes_goes_back_instead_of_being_renewed_for_ever(queues: Queues) -> None:
    q = queues.driver(queues=("other",), visibility_timeout=1)
    q.push(job("other", tries=1))
    waker = Waker()
    try:
        q.wait_for_jobs(["other"], 3.0, waker)  # a worker on "other" long-polls, then stops
        assert waker.is_set()
    finally:
        waker.close()
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:  # a worker on "default" keeps beating
        q.extend([])
        time.sleep(0.3)
    other = SqsQueue(
        q.queue_urls["default"],
        queue_urls={"other": q.queue_urls["other"]},
        failed_queue_url=q.failed_queue_url,
        endpoint=queues.endpoint,
        region="us-east-1",
        key="testing",
        secret="testing",
    )
    try:
        got = other.reserve_many(["other"], 1)  # another process's worker on "other" gets it, attempt 1
        assert [j.attempts for j in got] == [1]
        other.acknowledge_many(got)
    finally:
        other.close()
        q.close()
