"""The driver contract: every deferred driver passes these unchanged."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import pytest

from rainier_sync import Job, JobContext, JobRegistry, QueuedJob, QueueManager, Worker, WorkerOptions
from rainier_sync import job as job_function
from rainier_sync.drivers.base import BaseQueue, Capabilities
from rainier_sync.drivers.extensions import EXTENSIONS, Extension, ListsJobs
from rainier_sync.errors import CapabilityError
from rainier_sync.locks import MemoryLockStore

from .harness import Harness, harness_modules, load

_seq = 0


@pytest.fixture(params=harness_modules())
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from load(request.param)(request)


@pytest.fixture
def q(h: Harness) -> Iterator[BaseQueue]:
    driver = h.make()
    try:
        yield driver
    finally:
        driver.close()


def needs(h: Harness, guarantee: str) -> None:
    if guarantee in h.lacks:
        pytest.skip(f"{h.name} cannot {guarantee}: {h.lacks[guarantee]}")


def job(
    queue: str = "default", *, delay: float = 0.0, priority: int = 0, tries: int = 3, **payload: object
) -> QueuedJob:
    from rainier_sync import _clock

    global _seq
    _seq += 1
    now = _clock.now()
    return QueuedJob(
        id=f"job-{_seq:06d}-{id(payload)}",
        name="contract.job",
        queue=queue,
        payload=dict(payload) or {"n": _seq},
        max_attempts=tries,
        priority=priority,
        available_at=now + delay,
        dispatched_at=now,
    )


def _wait_for(predicate: Callable[[], bool], *, seconds: float, what: str) -> None:
    """Poll ``predicate`` for up to ``seconds`` of real sleeping (frozen time stalls
    ``time.monotonic``, so the bound counts naps, not clock readings)."""
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"waited {seconds}s for {what}")


def reserve_all(q: BaseQueue, queues: list[str], limit: int = 100) -> list[QueuedJob]:
    """Reserve until nothing more comes back (drivers may hand out fewer than asked)."""
    taken: list[QueuedJob] = []
    for _ in range(50):
        got = q.reserve_many(queues, limit - len(taken))
        if not got:
            break
        taken.extend(got)
        if len(taken) >= limit:
            break
    return taken


def test_push_then_reserve_hands_out_the_job_once(q: BaseQueue) -> None:
    pushed = job(text="héllo ✓", nested={"a": [1, 2, None]})
    assert q.push(pushed) == pushed.id
    got = q.reserve(["default"])
    assert got is not None
    assert (got.id, got.name, got.queue, got.payload) == (pushed.id, "contract.job", "default", pushed.payload)
    assert got.attempts == 1 and got.max_attempts == 3
    assert q.reserve(["default"]) is None, "a reserved job must be invisible to a second reserve"


def test_reserve_on_an_empty_queue_returns_nothing(q: BaseQueue) -> None:
    assert q.reserve(["default"]) is None
    assert q.reserve_many(["default", "other"], 5) == []


def test_acknowledge_removes_the_job(q: BaseQueue) -> None:
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    q.acknowledge(got)
    assert q.size("default") == 0
    assert q.reserve(["default"]) is None


def test_release_makes_the_job_available_again_with_its_attempts(q: BaseQueue) -> None:
    q.push(job())
    first = q.reserve(["default"])
    assert first is not None
    q.release(first, 0)
    second = q.reserve(["default"])
    assert second is not None and second.id == first.id
    assert second.attempts == 2


def test_release_with_a_delay_holds_the_job_until_due(h: Harness, q: BaseQueue) -> None:
    needs(h, "hold a released job for its delay")
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    q.release(got, h.delay)
    assert q.reserve(["default"]) is None
    assert q.size("default") == 1
    h.advance(h.delay + 1)
    again = reserve_all(q, ["default"], 1)
    assert [j.id for j in again] == [got.id]


def test_a_delayed_job_is_not_handed_out_early(h: Harness, q: BaseQueue) -> None:
    needs(h, "delay a job")
    q.push(job(delay=h.delay))
    assert q.reserve(["default"]) is None
    assert q.size("default") == 1
    h.advance(h.delay + 1)
    assert len(reserve_all(q, ["default"], 1)) == 1


def test_fail_moves_the_job_to_the_failed_store(q: BaseQueue) -> None:
    q.push(job(marker="x"))
    got = q.reserve(["default"])
    assert got is not None
    failed = q.fail(got, ValueError("it broke"))
    assert failed.id == got.id and failed.error == "ValueError: it broke"
    assert q.size("default") == 0
    listed = q.failed_jobs(10)
    assert [f.id for f in listed] == [got.id]
    assert listed[0].payload == {"marker": "x"}
    assert listed[0].error == "ValueError: it broke"
    assert listed[0].exception.kind == "ValueError"


def test_fail_accepts_a_string(q: BaseQueue) -> None:
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    q.fail(got, "gave up")
    assert "gave up" in q.failed_jobs(1)[0].error


def test_retry_failed_queues_it_again_with_fresh_attempts(q: BaseQueue) -> None:
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    q.fail(got, "no")
    assert q.retry_failed(got.id) is True
    assert q.failed_jobs(10) == []
    again = reserve_all(q, ["default"], 1)
    assert [j.id for j in again] == [got.id]
    assert again[0].attempts == 1
    assert q.retry_failed("no-such-id") is False


def test_forget_failed_deletes_it(q: BaseQueue) -> None:
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    q.fail(got, "no")
    assert q.forget_failed(got.id) is True
    assert q.failed_jobs(10) == []
    assert q.forget_failed(got.id) is False


def test_a_lapsed_reservation_is_reclaimed(h: Harness, q: BaseQueue) -> None:
    needs(h, "reclaim a lapsed reservation")
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    h.advance(h.reservation + 1)
    q.reclaim_expired()
    again = reserve_all(q, ["default"], 1)
    assert [j.id for j in again] == [got.id]
    assert again[0].attempts == 2


def test_extend_keeps_a_running_job_reserved(h: Harness, q: BaseQueue) -> None:
    needs(h, "extend a reservation")
    q.push(job())
    got = q.reserve(["default"])
    assert got is not None
    h.advance(h.reservation * 0.6)
    q.extend([got], h.reservation)
    h.advance(h.reservation * 0.6)
    q.reclaim_expired()
    assert q.reserve(["default"]) is None, "an extended reservation must not lapse"
    q.acknowledge(got)
    assert q.size("default") == 0


def test_lower_priority_runs_first_within_a_queue(h: Harness, q: BaseQueue) -> None:
    needs(h, "order by priority")
    low = job(priority=10)
    normal = job(priority=0)
    urgent = job(priority=-5)
    for j in (low, normal, urgent):
        q.push(j)
    order = [j.id for j in reserve_all(q, ["default"], 3)]
    assert order == [urgent.id, normal.id, low.id]


def test_queues_are_tried_in_the_order_given(h: Harness, q: BaseQueue) -> None:
    needs(h, "try queues strictly in the order given")
    background = [job("low") for _ in range(3)]
    important = [job("high") for _ in range(2)]
    q.push_many(background)
    q.push_many(important)
    taken = reserve_all(q, ["high", "low"], 2)
    assert sorted(j.id for j in taken) == sorted(j.id for j in important)


def test_push_many_stores_every_job(q: BaseQueue) -> None:
    jobs = [job(i=i) for i in range(25)]
    assert q.push_many(jobs) == [j.id for j in jobs]
    assert q.size("default") == 25
    taken = reserve_all(q, ["default"], 25)
    assert sorted(j.id for j in taken) == sorted(j.id for j in jobs)
    assert sorted(j.payload["i"] for j in taken) == list(range(25))  # type: ignore[type-var]


def test_size_counts_each_queue(q: BaseQueue) -> None:
    q.push_many([job("a"), job("a"), job("b")])
    assert q.size("a") == 2
    assert q.size("b") == 1
    assert q.size("c") == 0


def test_size_counts_reserved_jobs(q: BaseQueue) -> None:
    q.push(job())
    assert q.reserve(["default"]) is not None
    assert q.size("default") == 1


def test_give_back_returns_an_unstarted_job_at_once(h: Harness, q: BaseQueue) -> None:
    first, second = job(), job()
    q.push_many([first, second])
    taken = reserve_all(q, ["default"], 2)
    assert len(taken) == 2
    q.give_back(taken)
    again = reserve_all(q, ["default"], 2)
    assert sorted(j.id for j in again) == sorted([first.id, second.id])
    if "give back a job without counting its attempt" not in h.lacks:
        assert [j.attempts for j in again] == [1, 1], "a job that never started has not been attempted"


def test_a_deferred_job_comes_back_when_due_its_attempt_unspent(h: Harness, q: BaseQueue) -> None:
    if not q.capabilities.give_back:
        pytest.skip(f"{h.name} cannot put a job back uncounted: a deferral spends its try there")
    deferred = job()
    q.push(deferred)
    taken = reserve_all(q, ["default"], 1)
    assert [j.id for j in taken] == [deferred.id]
    q.defer(taken[0], 1.0)
    assert reserve_all(q, ["default"], 1) == [], "a deferred job is not due before its delay"
    h.advance(1.5)
    again: list[QueuedJob] = []

    def back() -> bool:
        again.extend(reserve_all(q, ["default"], 1))
        return bool(again)

    _wait_for(back, seconds=20, what="the deferred job to come back")
    assert [j.id for j in again] == [deferred.id]
    if "give back a job without counting its attempt" not in h.lacks:
        assert again[0].attempts == 1, "a deferral does not spend a try"


def test_meta_travels_with_the_job(q: BaseQueue) -> None:
    carried = job()
    carried.meta = {"tick": "schedule:x:2026", "trace": {"id": "ab", "n": [1, 2]}}
    q.push(carried)
    [got] = reserve_all(q, ["default"], 1)
    assert got.meta == carried.meta
    q.release(got, 0)
    [again] = reserve_all(q, ["default"], 1)
    assert again.meta == carried.meta, "a release keeps it"


@dataclass
class CrashProbe(Job):
    """A unique job that records its attempts and its ``failed()`` call."""

    NAME = "contract.crash-probe"
    TRIES = 1

    key: str

    ran: ClassVar[list[str]] = []
    failed_with: ClassVar[list[str]] = []

    def handle(self, context: JobContext) -> None:
        CrashProbe.ran.append(self.key)

    def failed(self, context: JobContext, error: BaseException) -> None:
        CrashProbe.failed_with.append(f"{type(error).__name__}: {error}")

    def unique_id(self) -> str:
        return self.key


def test_a_job_whose_worker_died_on_its_last_attempt_fails_as_crashed(h: Harness, q: BaseQueue) -> None:
    needs(h, "reclaim a lapsed reservation")
    CrashProbe.ran.clear()
    CrashProbe.failed_with.clear()
    locks = MemoryLockStore()
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(CrashProbe), locks=locks)
    job_id = manager.dispatch(CrashProbe(key="k1"))
    assert job_id is not None
    # A worker takes it and dies (nothing settles the reservation) ...
    assert [j.id for j in reserve_all(q, ["default"], 1)] == [job_id]
    h.advance(h.reservation + 1)
    q.reclaim_expired()
    # ... so its one attempt is spent: the next worker fails it instead of running attempt 2 of 1.
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05, reclaim_interval=0.5))
    worker.start()
    try:
        _wait_for(lambda: bool(q.failed_jobs(10)), seconds=30, what="the lost job to reach the failed store")
    finally:
        worker.stop(grace=5)
        stats = worker.join(15)
    assert CrashProbe.ran == [], "a job whose attempts are used up must not run again"
    [failed] = q.failed_jobs(10)
    assert failed.id == job_id
    assert failed.exception.kind == "rainier_sync.errors.JobCrashedError" and failed.exception.crashed
    assert "worker lost during attempt 1 of 1" in failed.error
    assert CrashProbe.failed_with == [f"JobCrashedError: {failed.exception.message}"]
    assert locks.owner("contract.crash-probe:k1") is None, "the unique lock goes with the failed job"
    assert (stats.processed, stats.failed) == (0, 1)


@dataclass
class Carries(Job):
    NAME = "contract.carries"

    value: object = None


def _nested(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (_nested(100_000), "field 'value' is nested more than"),
        ("a\ud800b", "field 'value' holds '\\ud800', a lone surrogate"),
        ({1: "a"}, "field 'value' has the key 1, which is not a string"),
        ({"inner": [{None: 1}]}, "field 'value' has the key None, which is not a string"),
    ],
    ids=["nested-100000-deep", "lone-surrogate", "int-key", "none-key-below"],
)
def test_a_payload_that_cannot_arrive_as_sent_is_refused_at_dispatch(
    q: BaseQueue, value: object, said: str
) -> None:
    from rainier_sync.errors import PayloadError

    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(Carries))
    with pytest.raises(PayloadError, match="job 'contract.carries': " + re.escape(said)):
        manager.dispatch(Carries(value))
    with pytest.raises(PayloadError, match=re.escape(said)):
        manager.dispatch_many([Carries(1), Carries(value)])
    assert q.size("default") == 0, "nothing of a refused dispatch is stored"


def test_a_queue_name_with_a_nul_is_refused_by_name(q: BaseQueue) -> None:
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(Carries))
    with pytest.raises(ValueError, match=r"queue name 'a\\x00b' contains a NUL character"):
        manager.dispatch_on("a\x00b", Carries(1))
    assert q.size("default") == 0


# -- the rest of the port: combined claims, repeated acknowledgements, wake-ups, counts ------------------


def test_acknowledge_and_reserve_settles_and_claims_in_one_call(q: BaseQueue) -> None:
    jobs = [job(i=i) for i in range(3)]
    q.push_many(jobs)
    done = reserve_all(q, ["default"], 2)
    assert len(done) == 2
    rest = q.acknowledge_and_reserve(done, ["default"], 5)
    rest += reserve_all(q, ["default"], 5 - len(rest))
    # Some drivers (Kafka's partitions) keep no order across the whole queue.
    assert sorted(j.id for j in done + rest) == sorted(j.id for j in jobs) and len(rest) == 1
    q.acknowledge(rest[0])
    assert q.size("default") == 0


def test_a_second_acknowledgement_is_harmless(q: BaseQueue) -> None:
    first, second = job(), job()
    q.push_many([first, second])
    taken = reserve_all(q, ["default"], 1)
    q.acknowledge_many(taken)
    q.acknowledge_many(taken)  # the worker sends it again when it cannot tell it landed
    assert q.acknowledge_and_reserve(taken, ["default"], 0) == []
    left = reserve_all(q, ["default"], 2)
    assert [j.id for j in left] == [second.id if taken[0].id == first.id else first.id]


def test_a_push_wakes_a_consumer_waiting_for_jobs(q: BaseQueue) -> None:
    if not q.capabilities.wakes:
        pytest.skip(f"{q.describe()} does not declare that a push wakes a waiting consumer")
    from rainier_sync.drivers.base import Waker

    session = q.open_session()
    waker = Waker()
    returned = threading.Event()

    def wait() -> None:
        session.wait_for_jobs(["default"], 60.0, waker)
        returned.set()

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    try:
        q.push(job())
        assert returned.wait(20), "a push did not wake a consumer waiting 60 s"
    finally:
        waker.set()
        waiting.join(30)
        session.close()
        waker.close()
    assert len(reserve_all(q, ["default"], 1)) == 1


def test_counts_tell_ready_delayed_and_reserved_jobs(h: Harness, q: BaseQueue) -> None:
    needs(h, "delay a job")
    q.push_many([job(), job(), job(delay=h.delay * 10)])
    assert len(reserve_all(q, ["default"], 1)) == 1
    counts = q.counts("default")
    assert (counts.total, counts.delayed) == (3, 1)
    if "tell reserved jobs from ready ones" not in h.lacks:
        assert (counts.ready, counts.reserved) == (1, 1)


def test_a_stored_job_nobody_can_read_goes_alone_to_the_failed_store(h: Harness, q: BaseQueue) -> None:
    if h.store_unreadable is None:
        pytest.skip(f"{h.name} keeps jobs as objects: nothing stored can be unreadable")
    good = [job(i=i) for i in range(3)]
    q.push(good[0])
    h.store_unreadable(q, "default")
    q.push_many(good[1:])
    heard: list[str] = []

    def on_discarded(sender: object, **kwargs: object) -> None:
        heard.append(str(kwargs["error"]))

    from rainier_sync import signals

    signals.queue_message_discarded.connect(on_discarded)
    try:
        taken = reserve_all(q, ["default"], 10)
    finally:
        signals.queue_message_discarded.disconnect(on_discarded)
    assert sorted(j.id for j in taken) == sorted(j.id for j in good), "every readable job is handed out"
    assert len(heard) == 1 and "PayloadError" in heard[0]
    [failed] = q.failed_jobs(10)
    assert "PayloadError" in failed.error


# -- capabilities: a driver that declares one is held to it; one that does not refuses it ----------


def test_a_driver_without_give_back_refuses_it(q: BaseQueue) -> None:
    if q.capabilities.give_back:
        pytest.skip("declares give_back: test_give_back_returns_an_unstarted_job_at_once holds it to it")
    q.push(job())
    with pytest.raises(CapabilityError, match="give_back"):
        q.give_back(reserve_all(q, ["default"], 1))


def test_streaming_push_stores_every_slice_or_is_refused(q: BaseQueue) -> None:
    slices = [[job(i=i) for i in range(start, start + 3)] for start in (0, 3, 6)]
    if not q.capabilities.streaming_push:
        with pytest.raises(CapabilityError, match="streaming_push"):
            q.push_stream(iter(slices))
        return
    q.push_stream(iter(slices))
    taken = reserve_all(q, ["default"], 9)
    assert sorted(j.payload["i"] for j in taken) == list(range(9))  # type: ignore[type-var]


def test_transactional_dispatch_is_refused_where_not_declared(q: BaseQueue) -> None:
    if q.capabilities.transactional_dispatch:
        pytest.skip("declares it: the database driver's tests hold it to it on each dialect")
    with pytest.raises(CapabilityError, match="transactional_dispatch"):
        q.push_within(object(), [job()])


def test_migrations_run_once_or_are_refused(q: BaseQueue) -> None:
    if not q.capabilities.migrations:
        with pytest.raises(CapabilityError, match="migrations"):
            q.migrate()
        return
    q.migrate()
    assert q.migrate() == [], "a second migrate has nothing left to apply"


def test_the_eviction_check_answers_or_is_refused(q: BaseQueue) -> None:
    if not q.capabilities.eviction_check:
        with pytest.raises(CapabilityError, match="eviction_check"):
            q.check_eviction_policy()
        return
    policy = q.check_eviction_policy()
    assert policy is None or isinstance(policy, str)


@pytest.mark.parametrize("kind", EXTENSIONS, ids=lambda kind: kind.__name__)
def test_each_extension_is_implemented_where_declared_and_refused_by_name_where_not(
    q: BaseQueue, kind: type[Extension]
) -> None:
    session = q.open_session()
    try:
        if kind.declared(q.capabilities):
            assert isinstance(q, kind), f"{q.kind} declares {kind.flag!r} and must implement {kind.__name__}"
            assert kind.of(q) is q and kind.of(session) is session
            for method in kind.refusals:
                assert callable(getattr(session, method)), f"the session forwards {method}"
            return
        for target in (q, session):
            with pytest.raises(CapabilityError, match=repr(kind.flag)):
                kind.of(target)
            if not isinstance(target, kind):
                for method in kind.refusals:
                    with pytest.raises(CapabilityError, match=f"cannot .*{kind.flag!r}"):
                        getattr(target, method)()
    finally:
        session.close()


def test_a_shipped_driver_promises_what_its_queue_driver_says(q: BaseQueue) -> None:
    assert q.driver is not None
    assert q.promises == q.driver.promises
    assert q.driver.is_deferred() == q.promises.deferred
    assert q.driver.survives_a_restart() == q.promises.survives_a_restart
    assert q.driver.may_lose_an_accepted_job() == q.promises.may_lose_an_accepted_job


def test_a_driver_declaring_an_extension_it_does_not_implement_is_refused_at_its_class() -> None:
    with pytest.raises(TypeError, match="declares 'listing' but is no ListsJobs"):

        class Claims(BaseQueue):  # noqa: F841 - its definition is what is refused
            capabilities = Capabilities(listing=True)

    class Lists(BaseQueue, ListsJobs):
        capabilities = Capabilities(listing=True)

    assert issubclass(Lists, ListsJobs)


def test_a_driver_that_reserves_renews_reservations(q: BaseQueue) -> None:
    assert q.reservation is None or q.capabilities.renews, "a reservation nothing can renew"


# -- chains ------------------------------------------------------------------------------------------------
@dataclass
class Link(Job):
    NAME = "contract.link"
    TRIES = 1

    n: int = 0
    fail: bool = False
    ran: ClassVar[list[int]] = []

    def handle(self, context: JobContext) -> None:
        Link.ran.append(self.n)
        if self.fail:
            raise RuntimeError(f"link {self.n} broke")


@pytest.mark.parametrize("breaks", [False, True], ids=["succeeds", "breaks"])
def test_a_chain_runs_its_links_in_order_and_a_failure_runs_catch_once(q: BaseQueue, breaks: bool) -> None:
    Link.ran.clear()
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(Link), locks=MemoryLockStore())
    manager.chain([Link(1), Link(2, fail=breaks), Link(3)]).catch(Link(99)).dispatch()
    expected = [1, 2, 99] if breaks else [1, 2, 3]
    worker = Worker(manager, options=WorkerOptions(concurrency=2, sleep=0.05))
    worker.start()
    try:
        _wait_for(lambda: len(Link.ran) >= len(expected), seconds=60, what=f"the links {expected} to run")
    finally:
        worker.stop(grace=5)
        worker.join(15)
    assert Link.ran == expected


# -- batches -----------------------------------------------------------------------------------------------
@dataclass
class Counted(Job):
    NAME = "contract.counted"
    TRIES = 1

    n: int = 0
    fail: bool = False
    heard: ClassVar[list[str]] = []

    def handle(self, context: JobContext) -> None:
        if self.n < 0:
            Counted.heard.append(f"callback {-self.n}")
        elif self.fail:
            raise RuntimeError(f"row {self.n} broke")


def test_a_batch_counts_every_job_once_and_runs_its_callbacks_once(q: BaseQueue) -> None:
    Counted.heard.clear()
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(Counted), locks=MemoryLockStore())
    batch = (
        manager.batch([Counted(n, fail=n == 3) for n in range(1, 9)], name="contract")
        .allow_failures()
        .then(Counted(-1))
        .catch(Counted(-2))
        .finally_(Counted(-3))
        .dispatch()
    )
    worker = Worker(manager, options=WorkerOptions(concurrency=4, sleep=0.05))
    worker.start()
    try:
        _wait_for(lambda: len(Counted.heard) >= 2, seconds=60, what="the batch's callbacks")
        _wait_for(lambda: q.size("default") == 0, seconds=30, what="the queue to empty")
    finally:
        worker.stop(grace=5)
        worker.join(15)
    done = manager.find_batch(batch.id)
    assert done is not None
    assert (done.total, done.processed, done.failed, done.pending, done.finished) == (8, 7, 1, 0, True)
    assert sorted(Counted.heard) == ["callback 2", "callback 3"], "catch and finally once; then needs no failure"


_function_calls: list[tuple[int, str]] = []


@job_function("contract.fn.ship", tries=2)
def ship(order_id: int, *, carrier: str = "post") -> dict[str, object]:
    _function_calls.append((order_id, carrier))
    return {"order": order_id}


def test_a_function_job_runs_on_every_driver(q: BaseQueue) -> None:
    _function_calls.clear()
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(ship), locks=MemoryLockStore())
    manager.dispatch(ship(1))
    manager.dispatch_many([ship(2, carrier="courier"), ship(3)])
    worker = Worker(manager, options=WorkerOptions(concurrency=2, sleep=0.05))
    worker.start()
    try:
        _wait_for(lambda: len(_function_calls) >= 3, seconds=60, what="the function jobs to run")
    finally:
        worker.stop(grace=5)
        worker.join(15)
    assert sorted(_function_calls) == [(1, "post"), (2, "courier"), (3, "post")]
    assert worker.stats.failed == 0


# -- a record the backend refuses costs its round nothing ----------------------------------------------------
@dataclass
class Raises(Job):
    """Succeeds, or raises an error holding ``text`` (written with Python's escapes:
    a payload may hold a NUL, never a lone surrogate)."""

    NAME = "contract.raises"
    TRIES = 1

    n: int = 0
    text: str = ""
    ran: ClassVar[list[int]] = []

    def handle(self, context: JobContext) -> None:
        if self.text:
            raise ValueError("broke on " + self.text.encode("ascii").decode("unicode_escape"))
        Raises.ran.append(self.n)


@contextlib.contextmanager
def operation_failures() -> Iterator[list[str]]:
    """Every backend operation a worker reports failed meanwhile."""
    from rainier_sync import signals

    heard: list[str] = []

    def record(sender: object, **kwargs: object) -> None:
        heard.append(f"{kwargs['operation']}: {kwargs['error']}")

    signals.queue_operation_failed.connect(record)
    try:
        yield heard
    finally:
        signals.queue_operation_failed.disconnect(record)


#: Texts an error may hold that some backend cannot store as they are, and how each is escaped.
AWKWARD = {"nul": ("a\\x00b", "a\x00b", "a\\u0000b"), "lone-surrogate": ("a\\udc80b", "a\udc80b", "a\\udc80b")}


@pytest.mark.parametrize("awkward", sorted(AWKWARD))
def test_an_error_a_backend_cannot_store_as_it_is_fails_its_job_and_the_rest_of_its_round_settles(
    q: BaseQueue, awkward: str
) -> None:
    spelt, text, escaped = AWKWARD[awkward]
    Raises.ran.clear()
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(Raises))
    manager.dispatch_many([Raises(n) for n in range(10)])
    bad = manager.dispatch(Raises(99, text=spelt))
    # Every job claimed in one round: the ten acknowledgements and the failure settle together.
    with operation_failures() as failures:
        stats = Worker(manager, options=WorkerOptions(once=True, concurrency=11, sleep=0.05)).run()
    assert failures == [], "no settle failed: a --once run gives up on a backend that keeps failing"
    assert sorted(Raises.ran) == list(range(10)), "each succeeding job ran exactly once"
    assert (stats.processed, stats.failed) == (10, 1)
    assert q.size("default") == 0, "every job of the round is settled"
    [failed] = q.failed_jobs(10)
    assert failed.id == bad
    # Stored as it was where the backend can hold it, escaped where it cannot.
    assert f"broke on {text}" in failed.error or f"broke on {escaped}" in failed.error, failed.error


def test_a_job_whose_name_holds_a_nul_fails_once_when_its_reservation_lapsed(h: Harness, q: BaseQueue) -> None:
    needs(h, "reclaim a lapsed reservation")
    from dataclasses import replace

    from rainier_sync.errors import PayloadError

    odd = replace(job(tries=1), name="contract.a\x00b")
    try:
        q.push(odd)
    except PayloadError as exc:  # a backend that cannot hold it says so at dispatch, naming the field
        assert "name" in str(exc), exc
        assert q.size("default") == 0
        return
    # A worker takes it and dies; the next one finds its one attempt spent and fails it.
    assert [j.id for j in reserve_all(q, ["default"], 1)] == [odd.id]
    h.advance(h.reservation + 1)
    q.reclaim_expired()
    manager = QueueManager({"contract": q}, registry=JobRegistry().with_job(Raises))
    with operation_failures() as failures:
        stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1, sleep=0.05)).run()
    assert failures == []
    assert stats.failed == 1
    assert q.size("default") == 0
    [failed] = q.failed_jobs(10)
    assert failed.id == odd.id and "worker lost during attempt 1 of 1" in failed.error, failed.error
    assert q.reclaim_expired() == 0 and reserve_all(q, ["default"], 1) == [], "nothing repeats"
