from __future__ import annotations

import pytest

import rainier_sync
from rainier_sync import PayloadError, QueueManager
from rainier_sync.testing import FakeQueueManager

from . import jobs


def test_the_fake_records_instead_of_performing() -> None:
    fake = QueueManager.fake()
    fake.dispatch(jobs.Record(1))
    fake.dispatch_on("mail", jobs.Record(2))
    fake.pending(jobs.Flaky()).delay(30).tries(9).send()
    fake.dispatch_now(jobs.Record(3))
    assert jobs.calls == [], "nothing runs"
    fake.assert_pushed(jobs.Record)
    fake.assert_pushed(jobs.Record, where=lambda job: job.value == 2)
    fake.assert_pushed_times(jobs.Record, 3)
    fake.assert_pushed_on(jobs.Record, "mail")
    fake.assert_not_pushed(jobs.Unique)
    fake.assert_not_pushed(jobs.Record, where=lambda job: job.value == 99)
    (flaky,) = fake.pushed(jobs.Flaky)
    assert flaky.max_attempts == 9 and flaky.available_at > flaky.dispatched_at


def test_fake_assertions_fail_with_a_useful_message() -> None:
    fake = QueueManager.fake()
    fake.assert_nothing_pushed()
    fake.dispatch(jobs.Record(1))
    with pytest.raises(AssertionError, match="expected nothing pushed; pushed: Record x1"):
        fake.assert_nothing_pushed()
    with pytest.raises(AssertionError, match="expected Flaky to be pushed"):
        fake.assert_pushed(jobs.Flaky)
    with pytest.raises(AssertionError, match="matching the predicate"):
        fake.assert_pushed(jobs.Record, where=lambda job: job.value == 2)
    with pytest.raises(AssertionError, match="pushed 2 time"):
        fake.assert_pushed_times(jobs.Record, 2)
    with pytest.raises(AssertionError, match="on queue 'mail'"):
        fake.assert_pushed_on(jobs.Record, "mail")
    with pytest.raises(AssertionError, match="not to be pushed"):
        fake.assert_not_pushed(jobs.Record)


def test_the_fake_still_refuses_a_bad_payload() -> None:
    with pytest.raises(PayloadError, match="field 'value'"):
        QueueManager.fake().dispatch(jobs.Record(value=object()))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.assert_pushed(jobs.Record),
        lambda m: m.assert_pushed_times(jobs.Record, 0),
        lambda m: m.assert_pushed_on(jobs.Record, "default"),
        lambda m: m.assert_not_pushed(jobs.Record),
        lambda m: m.assert_nothing_pushed(),
        lambda m: m.pushed(jobs.Record),
    ],
)
def test_assertions_on_a_real_manager_raise_rather_than_pass(manager: QueueManager, call: object) -> None:
    with pytest.raises(AssertionError, match=r"needs QueueManager.fake\(\)"):
        call(manager)  # type: ignore[operator]


def test_the_fake_queue_fixture_installs_itself(fake_queue: FakeQueueManager) -> None:
    assert rainier_sync.instance() is fake_queue
    rainier_sync.dispatch(jobs.Record("via instance"))
    fake_queue.assert_pushed(jobs.Record, where=lambda job: job.value == "via instance")


def test_every_dispatch_path_records_on_the_fake() -> None:
    fake = QueueManager.fake()
    fake.dispatch(jobs.Record("dispatch"))
    fake.dispatch_on("mail", jobs.Record("dispatch_on"))
    fake.dispatch_after(60, jobs.Record("dispatch_after"))
    fake.pending(jobs.Record("pending")).on_queue("high").on_connection("bulk").delay(5).tries(4).priority(-2).send()
    ids = fake.dispatch_many([jobs.Record("many-1"), jobs.Record("many-2")])
    fake.dispatch_now(jobs.Record("dispatch_now"))
    assert jobs.calls == [], "nothing runs"
    recorded = {p.job.value: p for p in fake.pushed_jobs(jobs.Record)}  # type: ignore[attr-defined]
    assert sorted(recorded) == sorted(
        ["dispatch", "dispatch_on", "dispatch_after", "pending", "many-1", "many-2", "dispatch_now"]
    )
    assert recorded["dispatch_on"].queued.queue == "mail"
    late = recorded["dispatch_after"].queued
    assert late.available_at - late.dispatched_at == pytest.approx(60)
    pending = recorded["pending"]
    assert (pending.queued.queue, pending.connection, pending.queued.max_attempts, pending.queued.priority) == (
        "high",
        "bulk",
        4,
        -2,
    )
    assert ids == [recorded["many-1"].queued.id, recorded["many-2"].queued.id]
    fake.assert_pushed_times(jobs.Record, 7)


@pytest.mark.parametrize("path", ["dispatch", "dispatch_on", "dispatch_after", "pending", "dispatch_many", "now"])
def test_every_dispatch_path_on_the_fake_still_checks_the_payload(path: str) -> None:
    fake = QueueManager.fake()
    bad = jobs.Record(object())
    send = {
        "dispatch": lambda: fake.dispatch(bad),
        "dispatch_on": lambda: fake.dispatch_on("mail", bad),
        "dispatch_after": lambda: fake.dispatch_after(5, bad),
        "pending": lambda: fake.pending(bad).send(),
        "dispatch_many": lambda: fake.dispatch_many([jobs.Record(1), bad]),
        "now": lambda: fake.dispatch_now(bad),
    }[path]
    with pytest.raises(PayloadError, match="field 'value' is not JSON-serialisable"):
        send()
    fake.assert_nothing_pushed()


def test_a_recorded_batch_reads_back_what_its_builder_set() -> None:
    fake = QueueManager.fake()
    rows = [jobs.Record(1), jobs.Record(2), jobs.Record(3)]
    done, failed, cleanup = jobs.Record("done"), jobs.Record("failed"), jobs.Record("cleanup")
    dispatched = (
        fake.batch(rows, name="import 42")
        .then(done)
        .catch(failed)
        .finally_(cleanup)
        .allow_failures()
        .on_queue("imports")
        .keep_for(3600)
        .dispatch()
    )
    fake.assert_batched(lambda b: b.name == "import 42")
    fake.assert_batched(lambda b: b.jobs == rows and b.callbacks == {"then": done, "catch": failed, "finally": cleanup})
    fake.assert_batched(lambda b: b.allows_failures and b.queue == "imports" and b.retention == 3600.0)
    fake.assert_batched(lambda b: b.id == dispatched.id and b.connection == "default")
    fake.batch([jobs.Record(4)]).dispatch()
    (first, plain) = fake.recording.batches
    assert (plain.name, plain.callbacks, plain.allows_failures, plain.queue) == (None, {}, False, None)
    assert plain.retention == 7 * 86400.0 and plain.id is not None and plain.id != first.id
    with pytest.raises(AssertionError) as raised:
        fake.assert_batched(lambda b: b.name == "import 43")
    said = str(raised.value)
    assert "PendingBatch(name='import 42', jobs=3, callbacks=[catch, finally, then]" in said
    assert "PendingBatch(name=None, jobs=1, callbacks=[]" in said


def test_a_real_batch_reads_back_what_its_builder_set_and_its_id() -> None:
    from rainier_sync.drivers import MemoryQueue
    from rainier_sync.locks import MemoryLockStore

    manager = QueueManager(
        {"main": MemoryQueue()}, registry=rainier_sync.JobRegistry().with_job(jobs.Record), locks=MemoryLockStore()
    )
    pending = manager.batch([jobs.Record(1)], name="nightly").then(jobs.Record("done"))
    assert pending.id is None and pending.name == "nightly" and pending.connection == "main"
    batch = pending.dispatch()
    assert pending.id == batch.id and pending.callbacks == {"then": jobs.Record("done")}
