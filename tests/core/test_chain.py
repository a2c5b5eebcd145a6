"""Chains on the memory driver: order, a failure that stops the chain and runs
``catch`` once, a crash between the hand-over and the acknowledgement, inline
runs, the fake, and bad input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue, SyncQueue
from rainier_sync.errors import ConfigurationError
from rainier_sync.locks import MemoryLockStore


@dataclass
class Step(Job):
    NAME = "chain.step"
    TRIES = 1

    n: int = 0
    fail: bool = False
    ran: ClassVar[list[int]] = []

    def handle(self, context: JobContext) -> None:
        Step.ran.append(self.n)
        if self.fail:
            raise RuntimeError(f"step {self.n} broke")


@dataclass
class Caught(Job):
    NAME = "chain.caught"

    ran: ClassVar[int] = 0

    def handle(self, context: JobContext) -> None:
        Caught.ran += 1


@pytest.fixture(autouse=True)
def _clean() -> None:
    Step.ran.clear()
    Caught.ran = 0


def build(driver: Any = None, locks: Any = "memory") -> tuple[QueueManager, Any]:
    driver = driver if driver is not None else MemoryQueue()
    registry = JobRegistry().with_job(Step).with_job(Caught)
    store = MemoryLockStore() if locks == "memory" else locks
    return QueueManager({"m": driver}, registry=registry, container=Container(), locks=store), driver


def drain(manager: QueueManager) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, concurrency=4)).run()


def test_links_run_in_order_one_after_another() -> None:
    manager, memory = build()
    chain_id = manager.chain([Step(1), Step(2), Step(3)]).catch(Caught()).dispatch()
    assert len(chain_id) == 32 and memory.size() == 1, "only the first link is queued"
    drain(manager)
    assert Step.ran == [1, 2, 3] and Caught.ran == 0 and memory.size() == 0


def test_a_final_failure_stops_the_chain_and_queues_catch_once() -> None:
    manager, memory = build()
    manager.chain([Step(1), Step(2, fail=True), Step(3)]).catch(Caught()).dispatch()
    stats = drain(manager)
    assert Step.ran == [1, 2] and Caught.ran == 1
    assert stats.failed == 1 and len(memory.failed) == 1


def test_links_go_to_their_own_queues_with_their_delays() -> None:
    manager, memory = build()
    manager.chain([Step(1), manager.pending(Step(2)).on_queue("slow")]).dispatch()
    Worker(manager, options=WorkerOptions(once=True, queues=["default"])).run()
    assert Step.ran == [1] and memory.size("slow") == 1
    Worker(manager, options=WorkerOptions(once=True, queues=["slow"])).run()
    assert Step.ran == [1, 2]


def test_a_crash_after_the_hand_over_runs_the_link_again_but_the_next_once() -> None:
    manager, memory = build()
    manager.chain([manager.pending(Step(1)).tries(3), Step(2)]).dispatch()
    [first] = memory.reserve_many(["default"], 1)
    worker = Worker(manager, options=WorkerOptions(once=True))
    completion = worker.executor.run(first)  # ran, handed the next link over; the ack never happened
    assert completion.outcome.value == "processed" and memory.size() == 2, "the link still held, the next queued"
    memory.release(first, 0)  # its reservation lapses: delivered again
    stats = drain(manager)
    assert sorted(Step.ran) == [1, 1, 2], "the first link ran twice (at least once), the second once"
    assert stats.skipped == 1, "the second hand-over's copy of link 2 was skipped"
    assert memory.size() == 0


def test_a_chain_runs_inline_on_the_sync_driver() -> None:
    manager, _ = build(SyncQueue())
    manager.chain([Step(1), Step(2), Step(3)]).dispatch()
    assert Step.ran == [1, 2, 3]


def test_the_fake_records_chains() -> None:
    fake = QueueManager.fake()
    fake.chain([Step(1), Step(2)]).catch(Caught()).dispatch()
    fake.assert_chained([Step, Step])
    fake.assert_chained([Step, lambda job: job.n == 2])
    with pytest.raises(AssertionError, match="Step -> Step"):
        fake.assert_chained([Step, Caught])
    fake.assert_nothing_pushed()


@pytest.mark.parametrize(
    ("links", "error", "said"),
    [
        ([], ValueError, "at least one job"),
        ([Step(1), "not a job"], TypeError, "link 1 of the chain"),
        (Step(1), TypeError, "a list of jobs"),
    ],
)
def test_bad_chains_are_refused_naming_the_fault(links: Any, error: type[Exception], said: str) -> None:
    manager, _ = build()
    with pytest.raises(error, match=said):
        manager.chain(links)


def test_an_unregistered_link_and_a_missing_lock_store_are_refused() -> None:
    @dataclass
    class Stray(Job):
        NAME = "chain.stray"

        def handle(self, context: JobContext) -> None:
            pass

    manager, _ = build()
    with pytest.raises(ConfigurationError, match="link 1 of the chain: job 'chain.stray' is not registered"):
        manager.chain([Step(1), Stray()])
    with pytest.raises(ConfigurationError, match="catch: job 'chain.stray' is not registered"):
        manager.chain([Step(1)]).catch(Stray())
    unlocked, _ = build(locks=None)
    with pytest.raises(ConfigurationError, match="locks="):
        unlocked.chain([Step(1)]).dispatch()


def test_a_retried_link_that_fails_again_runs_catch_again_only_after_its_key_is_held_a_week() -> None:
    from freezegun import freeze_time

    from rainier_sync.once import DEFAULT_HOLD

    manager, memory = build()
    with freeze_time("2026-03-01 12:00:00") as frozen:
        manager.chain([Step(1), Step(2, fail=True), Step(3)]).catch(Caught()).dispatch()
        drain(manager)
        assert Step.ran == [1, 2] and Caught.ran == 1
        (failed,) = memory.failed
        frozen.tick(DEFAULT_HOLD - 60)
        assert manager.retry_failed(failed.id)
        drain(manager)
        assert Step.ran == [1, 2, 2] and Caught.ran == 1, "within the week: catch once per chain"
        frozen.tick(120)
        assert manager.retry_failed(failed.id)
        drain(manager)
        assert Step.ran == [1, 2, 2, 2] and Caught.ran == 2, "the key was let go after a week"
