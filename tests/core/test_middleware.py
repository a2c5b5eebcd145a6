"""Job middleware on the memory driver: defer and skip, the built-ins, and bad input."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.errors import ConfigurationError, JobDefinitionError
from rainier_sync.locks import MemoryLockStore
from rainier_sync.middleware import RateLimited, Skip, ThrottlesExceptions, WithoutOverlapping

ran: list[Any] = []


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()
    Limited.limit = 2


@dataclass
class DeferOnce(Job):
    NAME = "mw.defer-once"

    n: int = 0
    deferred: ClassVar[set[int]] = set()

    def middleware(self) -> list[Any]:
        return [DeferFirst()]

    def handle(self, context: JobContext) -> None:
        ran.append(("defer-once", self.n, context.attempt))


class DeferFirst:
    def handle(self, job: Any, context: JobContext, call_next: Callable[[], None]) -> None:
        if job.n not in DeferOnce.deferred:
            DeferOnce.deferred.add(job.n)
            context.defer(30, "not yet")
            return
        call_next()


@dataclass
class Limited(Job):
    NAME = "mw.limited"
    limit: ClassVar[int] = 2

    n: int = 0

    def middleware(self) -> list[Any]:
        return [RateLimited("api", limit=Limited.limit, per=10)]

    def handle(self, context: JobContext) -> None:
        ran.append(("limited", self.n, context.attempt))


@dataclass
class Flaky(Job):
    NAME = "mw.flaky"
    TRIES = 100

    fail: bool = True

    def middleware(self) -> list[Any]:
        return [ThrottlesExceptions(max_exceptions=2, decay=60)]

    def handle(self, context: JobContext) -> None:
        ran.append(("flaky", self.fail))
        if self.fail:
            raise RuntimeError("the service is down")


@dataclass
class Exclusive(Job):
    NAME = "mw.exclusive"

    key: str = "k"
    gate: ClassVar[dict[str, threading.Event]] = {}
    started: ClassVar[dict[str, threading.Event]] = {}

    def middleware(self) -> list[Any]:
        return [WithoutOverlapping(self.key, expire_after=60, release_after=5)]

    def handle(self, context: JobContext) -> None:
        Exclusive.started.setdefault(context.id, threading.Event()).set()
        ran.append(("exclusive", context.id))
        assert Exclusive.gate.setdefault(self.key, threading.Event()).wait(10)


@dataclass
class Account(Job):
    NAME = "mw.account"

    account_id: int = 0

    def middleware(self) -> list[Any]:
        return [Skip.when(lambda job: job.account_id == 0)]

    def handle(self, context: JobContext) -> None:
        ran.append(("account", self.account_id))


def build(*classes: type[Job], locks: Any = "memory") -> tuple[QueueManager, MemoryQueue]:
    memory = MemoryQueue(reservation=60)
    registry = JobRegistry()
    for cls in classes:
        registry.register(cls)
    store = MemoryLockStore() if locks == "memory" else locks
    return QueueManager({"m": memory}, registry=registry, container=Container(), locks=store), memory


def once(manager: QueueManager, **options: Any) -> Any:
    options.setdefault("concurrency", 1)
    return Worker(manager, options=WorkerOptions(once=True, **options)).run()


def test_a_deferred_job_comes_back_when_due_without_spending_a_try() -> None:
    DeferOnce.deferred.clear()
    manager, memory = build(DeferOnce)
    heard: list[tuple[str, float, str]] = []

    def on_deferred(sender: Any, job: Any, connection: Any, delay: float, reason: str) -> None:
        heard.append((job.name, delay, reason))

    signals.job_deferred.connect(on_deferred)
    try:
        with freeze_time("2026-05-01 12:00:00") as frozen:
            manager.dispatch(DeferOnce(n=1))  # TRIES = 1: a spent try would fail it
            stats = once(manager)
            assert (stats.processed, stats.deferred) == (0, 1) and ran == []
            [waiting] = memory.jobs
            assert waiting.attempts == 0, "a deferral spends no try"
            frozen.tick(29)
            assert once(manager).processed == 0, "not before it is due"
            frozen.tick(2)
            stats = once(manager)
    finally:
        signals.job_deferred.disconnect(on_deferred)
    assert stats.processed == 1 and ran == [("defer-once", 1, 1)]
    assert heard == [(DeferOnce.NAME, 30.0, "not yet")]


def test_a_rate_limit_defers_what_the_window_has_no_room_for_and_runs_it_later() -> None:
    manager, memory = build(Limited)
    with freeze_time("2026-05-01 12:00:00") as frozen:
        manager.dispatch_many([Limited(n=i) for i in range(5)])
        stats = once(manager)
        assert (stats.processed, stats.deferred) == (2, 3)
        assert all(job.attempts == 0 for job in memory.jobs), "the deferred ones spent no try"
        frozen.tick(11)
        assert once(manager).processed == 2
        frozen.tick(11)
        assert once(manager).processed == 1
    assert sorted(n for _, n, _ in ran) == [0, 1, 2, 3, 4]
    assert {attempt for _, _, attempt in ran} == {1}


def test_exception_throttling_opens_after_the_failures_and_closes_after_the_decay() -> None:
    store = MemoryLockStore()
    throttle = ThrottlesExceptions(max_exceptions=2, decay=60)
    throttle.store = store

    def attempt(fail: bool) -> JobContext:
        context = JobContext(Container(), "id", "default", 1, 5, name=Flaky.NAME)

        def call_next() -> None:
            ran.append("ran")
            if fail:
                raise RuntimeError("down")

        try:
            throttle.handle(Flaky(), context, call_next)
        except RuntimeError:
            pass
        return context

    with freeze_time("2026-05-01 12:00:00") as frozen:
        attempt(fail=True)
        frozen.tick(10)
        attempt(fail=True)  # two failures within 60 s: open
        frozen.tick(10)
        deferred = attempt(fail=False)
        assert deferred.decision is not None and deferred.decision[0] == "defer"
        assert deferred.decision[1] == pytest.approx(50), "until decay seconds after the last failure"
        assert ran == ["ran", "ran"]
        frozen.tick(51)  # the decay has passed since the last failure: closed again
        assert attempt(fail=False).decision is None and ran == ["ran", "ran", "ran"]
        attempt(fail=True)
        attempt(fail=False)  # a success resets the count
        assert store.counted(f"throttle:{Flaky.NAME}") == (0, 0.0)


def test_a_throttled_job_is_deferred_by_the_worker_without_spending_tries() -> None:
    store = MemoryLockStore()
    manager, memory = build(Flaky, locks=store)
    with freeze_time("2026-05-01 12:00:00") as frozen:
        manager.dispatch_many([Flaky(), Flaky()])
        once(manager, concurrency=2)  # two failures: the throttle opens
        frozen.tick(5)  # their retries are due (a backoff of 1 s), the throttle is open for 60 s
        stats = once(manager, concurrency=2)
        assert stats.deferred == 2 and len(ran) == 2
        assert sorted(job.attempts for job in memory.jobs) == [1, 1], "a deferral spends no try"


def test_without_overlapping_defers_the_second_of_one_key_while_the_first_runs() -> None:
    from tests.support import wait_until

    manager, memory = build(Exclusive)
    same = {manager.dispatch(Exclusive(key="acct-1")), manager.dispatch(Exclusive(key="acct-1"))}
    other = manager.dispatch(Exclusive(key="acct-2"))
    Exclusive.gate["acct-2"] = threading.Event()
    Exclusive.gate["acct-2"].set()
    worker = Worker(manager, options=WorkerOptions(concurrency=3, sleep=0.05))
    worker.start()
    try:
        wait_until(lambda: worker.stats.deferred >= 1, 10, message="one job of acct-1 to be deferred")
        assert Exclusive.started.setdefault(str(other), threading.Event()).wait(5), "another key is not held up"
        running = [job_id for _, job_id in ran if job_id in same]
        assert len(running) == 1, "two jobs of one key ran at once"
    finally:
        Exclusive.gate.setdefault("acct-1", threading.Event()).set()
        worker.stop(grace=5)
        worker.join(10)
    assert memory.size() == 1, "the deferred one waits for its turn, not lost"
    assert sorted(job.attempts for job in memory.jobs) == [0], "and spent no try"


def test_skip_when_acknowledges_the_job_unrun() -> None:
    manager, memory = build(Account)
    heard: list[str] = []

    def on_skipped(sender: Any, job: Any, connection: Any, reason: str) -> None:
        heard.append(reason)

    signals.job_skipped.connect(on_skipped)
    try:
        manager.dispatch_many([Account(account_id=0), Account(account_id=7)])
        stats = once(manager)
    finally:
        signals.job_skipped.disconnect(on_skipped)
    assert (stats.processed, stats.skipped) == (1, 1)
    assert ran == [("account", 7)] and memory.size() == 0
    assert len(heard) == 1 and heard[0].startswith("Skip.when(")


def test_skip_unless() -> None:
    skip = Skip.unless(lambda job: job.account_id > 5)
    context = JobContext(Container(), "id", "default", 1, 1)
    skip.handle(Account(account_id=2), context, lambda: ran.append("ran"))
    assert context.decision is not None and context.decision[0] == "skip" and ran == []


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: RateLimited("api", limit=0, per=1), "RateLimited limit must be a positive whole number"),
        (lambda: RateLimited("api", limit=10, per=0), "RateLimited per must be a positive number"),
        (lambda: RateLimited("api", limit=True, per=1), "RateLimited limit"),
        (lambda: ThrottlesExceptions(max_exceptions=0, decay=60), "ThrottlesExceptions max_exceptions"),
        (lambda: ThrottlesExceptions(max_exceptions=3, decay=-1), "ThrottlesExceptions decay"),
        (lambda: WithoutOverlapping("k", expire_after=0), "WithoutOverlapping expire_after"),
        (lambda: Skip.when("not callable"), "Skip.when needs a callable predicate"),  # type: ignore[arg-type]
    ],
)
def test_bad_middleware_arguments_are_refused_naming_them(make: Callable[[], Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        make()


def test_a_middleware_without_handle_is_refused_at_registration() -> None:
    @dataclass
    class Broken(Job):
        NAME = "mw.broken"

        def middleware(self) -> list[Any]:
            return [object()]

    with pytest.raises(JobDefinitionError, match=r"Broken.middleware\(\) returns .* which has no handle"):
        JobRegistry().register(Broken)


def test_a_worker_without_a_lock_store_refuses_jobs_that_need_one() -> None:
    manager, _ = build(Limited, Account, locks=None)
    said = r"jobs mw.limited keep state in a lock store \(middleware, KEEP_RESULT\).* give QueueManager locks="
    with pytest.raises(ConfigurationError, match=said):
        Worker(manager)


class BrokenStore(MemoryLockStore):
    def take(self, key: str, limit: int, per: float) -> float:
        raise ConnectionError("lock store down")

    def take_many(self, key: str, n: int, limit: int, per: float, hold: float = 0.0) -> tuple[int, list[float]]:
        raise ConnectionError("lock store down")


def test_a_lock_store_that_fails_defers_the_job_never_runs_it_past_its_limit() -> None:
    manager, memory = build(Limited, locks=BrokenStore())
    manager.dispatch(Limited(n=1))
    stats = once(manager)
    assert (stats.processed, stats.deferred, stats.failed) == (0, 1, 0) and ran == []
    [job] = memory.jobs
    assert job.attempts == 0 and memory.size() == 1


def test_a_job_without_middleware_runs_no_chain() -> None:
    class Plain(Job):
        NAME = "mw.plain"

    assert Plain().middleware() == []


# -- paused queues -----------------------------------------------------------------------------------


def test_a_paused_queue_is_not_claimed_from_and_resumes() -> None:
    from rainier_sync.drivers import MemoryQueue as Memory

    @dataclass
    class Mail(Job):
        NAME = "mw.mail"
        QUEUE = "mail"

        def handle(self, context: JobContext) -> None:
            ran.append("mail")

    manager, memory = build(Mail, Account)
    manager.pause("mail")
    assert manager.paused() == {"mail"}
    manager.dispatch(Mail())  # dispatching still works
    manager.dispatch_on("default", Account(account_id=3))
    stats = once(manager, queues=["mail", "default"])
    assert stats.processed == 1 and ran == [("account", 3)], "only the queue not paused was worked"
    assert isinstance(memory, Memory) and memory.size("mail") == 1
    manager.resume("mail")
    assert manager.paused() == set()
    assert once(manager, queues=["mail", "default"]).processed == 1 and ran[-1] == "mail"


def test_a_running_worker_stops_claiming_from_a_queue_paused_elsewhere_within_its_sleep() -> None:
    from tests.support import wait_until

    manager, memory = build(Account)
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.1))
    worker.start()
    try:
        manager.dispatch(Account(account_id=1))
        wait_until(lambda: worker.stats.processed == 1, 10, message="the first job")
        manager.pause("default")
        wait_until(lambda: worker._claimable.paused == {"default"}, 10, message="the worker to see the pause")
        manager.dispatch(Account(account_id=2))
        threading.Event().wait(0.3)
        assert worker.stats.processed == 1 and memory.size("default") == 1, "a paused queue was claimed from"
        manager.resume("default")
        wait_until(lambda: worker.stats.processed == 2, 10, message="the job after resume")
    finally:
        worker.stop(grace=5)
        worker.join(10)


def test_pausing_needs_a_lock_store_and_a_declared_connection() -> None:
    from rainier_sync.errors import UnknownConnectionError

    manager, _ = build(Account, locks=None)
    with pytest.raises(ConfigurationError, match="pausing a queue needs a lock store"):
        manager.pause("default")
    assert manager.paused() == set()
    manager, _ = build(Account)
    with pytest.raises(UnknownConnectionError, match="'elsewhere' is not declared"):
        manager.pause("default", connection="elsewhere")
    with pytest.raises(ValueError, match="NUL"):
        manager.pause("a\x00b")


def test_a_once_run_with_every_queue_paused_returns() -> None:
    manager, memory = build(Account)
    manager.pause("default")
    manager.dispatch(Account(account_id=1))
    stats = once(manager)
    assert stats.processed == 0 and memory.size() == 1


class DeferBriefly:
    def handle(self, job: Any, context: JobContext, call_next: Callable[[], None]) -> None:
        if job.n not in DeferOnce.deferred:
            DeferOnce.deferred.add(job.n)
            context.defer(0.01, "a moment")
            return
        call_next()


@dataclass
class DeferBrieflyOnce(DeferOnce):
    NAME = "mw.defer-briefly"

    def middleware(self) -> list[Any]:
        return [DeferBriefly()]


def test_dispatch_now_runs_a_skipped_job_never_and_returns() -> None:
    manager, _ = build(Account)
    job_id = manager.dispatch_now(Account(account_id=0))
    assert job_id and ran == []


def test_dispatch_now_waits_out_a_deferral_then_runs_the_job_on_the_same_try() -> None:
    DeferOnce.deferred.clear()
    manager, _ = build(DeferBrieflyOnce)
    manager.dispatch_now(DeferBrieflyOnce(n=4))
    assert ran == [("defer-once", 4, 1)]
