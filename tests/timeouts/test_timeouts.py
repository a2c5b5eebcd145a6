"""Attempts with a time limit run in supervised child processes (memory driver)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from freezegun import freeze_time

from rainier_sync import Container, Job, JobRegistry, QueueManager, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.errors import ConfigurationError
from rainier_sync.locks import MemoryLockStore
from rainier_sync.types import ExceptionInfo
from rainier_sync.worker import Worker, WorkerOptions, WorkerStats
from tests.support import wait_until

from . import jobs

pytestmark = pytest.mark.timeout(60)

NAMES = ("job_processing", "job_processed", "job_released", "job_failed", "job_attempt_failed")


@pytest.fixture
def memory() -> MemoryQueue:
    return MemoryQueue(reservation=60)


@pytest.fixture
def manager(memory: MemoryQueue) -> QueueManager:
    registry = JobRegistry()
    for cls in jobs.ALL:
        registry.register(cls)
    container = Container()
    manager = QueueManager({"main": memory}, "main", registry, container, locks=MemoryLockStore())
    container.instance(QueueManager, manager)
    return manager


@pytest.fixture(autouse=True)
def _reset() -> None:
    jobs.Sleeper.failed_calls.clear()


@pytest.fixture
def log(tmp_path: Path) -> str:
    return str(tmp_path / "log.txt")


@pytest.fixture
def events() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for name in NAMES:

        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            seen.append((_name, kwargs))

        receivers.append(receiver)
        getattr(signals, name).connect(receiver)
    yield seen
    for name, receiver in zip(NAMES, receivers, strict=True):
        getattr(signals, name).disconnect(receiver)


def run_once(manager: QueueManager, **options: Any) -> WorkerStats:
    options.setdefault("concurrency", 2)
    return Worker(manager, options=WorkerOptions(once=True, **options)).run()


def survives(manager: QueueManager, memory: MemoryQueue, bad: Job, log: str) -> ExceptionInfo:
    """Run ``bad`` then a healthy job; the worker fails the first and processes the second."""
    manager.dispatch(bad)
    manager.dispatch(jobs.Noop(log=log))
    stats = run_once(manager, concurrency=1)
    assert (stats.processed, stats.failed) == (1, 1)
    assert [int(pid) for pid in jobs.notes(log)] != [os.getpid()]
    assert memory.size() == 0
    [failed] = memory.failed
    assert failed.exception is not None
    return failed.exception


def test_a_job_that_sleeps_past_its_limit_is_killed_then_failed_after_its_last_attempt(
    manager: QueueManager, memory: MemoryQueue, log: str, events: list[tuple[str, dict[str, Any]]]
) -> None:
    manager.dispatch(jobs.Sleeper(log=log))
    stats = run_once(manager)
    assert (stats.processed, stats.released, stats.failed) == (0, 1, 1)
    starts = [line for line in jobs.notes(log) if line.startswith("start")]
    assert len(starts) == 2 and "woke" not in jobs.notes(log)
    [failed] = memory.failed
    assert failed.exception is not None and failed.exception.timed_out and not failed.exception.crashed
    assert failed.exception.kind == "rainier_sync.errors.JobTimeoutError"
    assert "time limit of 0.5s and was stopped with SIGTERM" in failed.error
    # failed() ran once, in the worker's process, with the timeout error
    assert jobs.Sleeper.failed_calls == [(os.getpid(), "JobTimeoutError")]
    names = [name for name, _ in events]
    assert names.count("job_processing") == 2
    assert names.count("job_released") == 1 and names.count("job_failed") == 1
    released = next(kw for name, kw in events if name == "job_released")
    assert released["exception"].timed_out


@pytest.mark.parametrize("job", [jobs.Spinner(), jobs.BlockedRead()], ids=["cpu-spin", "blocked-in-c"])
def test_a_job_that_never_yields_is_killed(manager: QueueManager, memory: MemoryQueue, log: str, job: Job) -> None:
    info = survives(manager, memory, job, log)
    assert info.timed_out and not info.crashed
    # the traceback shows where the job was when it was stopped
    where = info.traceback.split("The job was here when it was stopped")[1]
    assert "tests/timeouts/jobs.py" in where and "in handle" in where


def test_a_job_that_ignores_sigterm_is_killed_with_sigkill(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    info = survives(manager, memory, jobs.Stubborn(), log)
    assert info.timed_out
    assert "stopped with SIGKILL, as it outlived SIGTERM by 1s" in info.message


def test_a_child_that_exits_on_its_own_fails_the_attempt_as_crashed(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    info = survives(manager, memory, jobs.Exits(), log)
    assert info.crashed and not info.timed_out
    assert info.kind == "rainier_sync.errors.JobCrashedError"
    assert "exited with code 3" in info.message


def test_a_segfault_fails_the_attempt_as_crashed(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    info = survives(manager, memory, jobs.Segfaults(), log)
    assert info.crashed
    assert "SIGSEGV" in info.message


def test_a_child_killed_by_hand_fails_the_attempt_as_crashed(
    manager: QueueManager, memory: MemoryQueue, tmp_path: Path, log: str
) -> None:
    victim_log = str(tmp_path / "victim.txt")
    manager.dispatch(jobs.WaitsToBeKilled(log=victim_log))
    worker = Worker(manager, options=WorkerOptions(concurrency=1))
    worker.start()
    try:
        wait_until(lambda: bool(jobs.notes(victim_log)), timeout=10, message="the job to start in its child")
        os.kill(int(jobs.notes(victim_log)[0]), signal.SIGKILL)  # what the OOM killer does
        wait_until(lambda: len(memory.failed) == 1, timeout=10, message="the attempt to fail")
        manager.dispatch(jobs.Noop(log=log))
        wait_until(lambda: worker.stats.processed == 1, timeout=10, message="the next job")
    finally:
        worker.stop()
        worker.join(10)
    info = memory.failed[0].exception
    assert info is not None and info.crashed and "SIGKILL" in info.message


def test_an_exception_in_the_child_comes_back_whole(
    manager: QueueManager, memory: MemoryQueue, log: str, events: list[tuple[str, dict[str, Any]]]
) -> None:
    info = survives(manager, memory, jobs.Raises(), log)
    assert info.kind == "tests.timeouts.jobs.LedgerError"
    assert info.message == "could not post entry 7"
    assert info.causes == (("KeyError", "'account 42'"), ("ConnectionResetError", "peer went away"))
    assert "raise LedgerError" in info.traceback and "jobs.py" in info.traceback
    assert "ConnectionResetError: peer went away" in info.traceback
    assert not info.timed_out and not info.crashed
    assert memory.failed[0].error == "tests.timeouts.jobs.LedgerError: could not post entry 7"
    [failed_event] = [kw for name, kw in events if name == "job_failed"]
    assert failed_event["exception"] == info
    assert failed_event["error"] == memory.failed[0].error


def test_a_failure_reads_the_same_from_a_child_as_from_a_thread(manager: QueueManager, memory: MemoryQueue) -> None:
    manager.dispatch(jobs.Raises())
    manager.dispatch(jobs.RaisesInThread())
    assert run_once(manager, concurrency=1).failed == 2
    by_name = {f.name: f for f in memory.failed}
    child, thread = by_name[jobs.Raises.NAME], by_name[jobs.RaisesInThread.NAME]
    assert child.error == thread.error
    assert child.exception is not None and thread.exception is not None
    assert (child.exception.kind, child.exception.message, child.exception.causes) == (
        thread.exception.kind,
        thread.exception.message,
        thread.exception.causes,
    )
    assert child.exception.traceback.splitlines()[-1] == thread.exception.traceback.splitlines()[-1]


def test_a_flood_of_short_timed_jobs_reuses_its_children(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    manager.dispatch_many([jobs.Noop(log=log) for _ in range(200)])
    worker = Worker(manager, options=WorkerOptions(concurrency=4, once=True, max_jobs_per_child=50))
    supervisors: list[Any] = []
    original = worker.attempts.get_supervisor

    def spy() -> Any:
        supervisor = original()
        if supervisor is not None and supervisor not in supervisors:
            supervisors.append(supervisor)
        return supervisor

    worker.attempts.get_supervisor = spy  # type: ignore[method-assign]
    stats = worker.run()
    assert stats.processed == 200 and stats.failed == 0 and memory.size() == 0
    pids = {int(pid) for pid in jobs.notes(log)}
    [supervisor] = supervisors
    assert os.getpid() not in pids
    # at most one child per thread, each replaced after 50 attempts: 4 + 200 / 50
    assert len(pids) <= supervisor.started <= 8


def test_jobs_without_a_time_limit_run_in_the_worker_process(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Untimed(log=log))
    manager.dispatch(jobs.Noop(log=log))
    stats = run_once(manager, concurrency=1)
    assert stats.processed == 2
    assert [int(pid) == os.getpid() for pid in jobs.notes(log)] == [True, False]


def test_the_worker_timeout_applies_to_jobs_without_their_own(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Untimed(log=log))
    stats = run_once(manager, concurrency=1, timeout=5)
    assert stats.processed == 1
    assert int(jobs.notes(log)[0]) != os.getpid()


def test_stop_requested_is_set_in_the_child_before_its_time_is_up(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Cooperative(log=log))
    stats = run_once(manager, concurrency=1)
    assert stats.processed == 1  # it noticed, and finished before the limit
    seen, elapsed, pid = jobs.notes(log)[0].split()
    assert seen == "True" and int(pid) != os.getpid()
    assert 2.0 < float(elapsed) < 3.0


def test_a_limit_is_kept_in_real_time_while_time_is_frozen(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    with freeze_time("2026-03-01 12:00:00"):
        manager.dispatch(jobs.Spinner())
        manager.dispatch(jobs.Noop(log=log))
        stats = run_once(manager, concurrency=1)
    assert (stats.processed, stats.failed) == (1, 1)
    assert memory.failed[0].exception is not None and memory.failed[0].exception.timed_out


def test_stop_lets_a_cooperative_child_attempt_finish(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    manager.dispatch(jobs.Cooperative(log=log))
    worker = Worker(manager, options=WorkerOptions(concurrency=1, grace=5))
    worker.start()
    wait_until(lambda: bool(jobs.notes(log + ".started")), timeout=10, message="the job to start in its child")
    worker.stop()
    stats = worker.join(10)
    assert stats.processed == 1 and memory.size() == 0
    seen, elapsed, _ = jobs.notes(log)[0].split()
    assert seen == "True" and float(elapsed) < 2.0  # told by stop(), not by its deadline


def test_stop_releases_a_child_attempt_still_running_after_the_grace(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Slow(log=log))
    worker = Worker(manager, options=WorkerOptions(concurrency=1, grace=0.2))
    worker.start()
    wait_until(lambda: bool(jobs.notes(log)), timeout=10, message="the job to start in its child")
    worker.stop()
    stats = worker.join(10)
    assert not worker._thread or not worker._thread.is_alive()
    assert (stats.processed, stats.released, stats.failed, stats.interrupted) == (0, 0, 0, 1)
    assert memory.failed == []
    # handed back at once, not left to its reservation: another worker may take it now,
    # and the attempt the stop cut short is not spent
    assert memory.size() == 1 and not memory._reserved
    [again] = memory.reserve_many(["default"], 1)
    assert again.name == jobs.Slow.NAME and again.attempts == 1


def _running(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _killed(pid: int) -> None:
    try:
        wait_until(lambda: not _running(pid), timeout=10, message=f"process {pid} to be killed")
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a session's processes are reaped on Linux")


@pytest.mark.parametrize(
    "session", [False, pytest.param(True, marks=LINUX)], ids=["in the child's group", "in a session of its own"]
)
@pytest.mark.parametrize("when", ["its time runs out", "the worker exits"])
def test_a_grandchild_the_job_started_is_killed_with_its_child(
    manager: QueueManager, memory: MemoryQueue, log: str, when: str, session: bool
) -> None:
    overrun = when == "its time runs out"
    manager.dispatch(jobs.Forks(log=log, overrun=overrun, session=session))
    stats = run_once(manager, concurrency=1)
    assert (stats.processed, stats.failed) == ((0, 1) if overrun else (1, 0))
    [grandchild] = [int(pid) for pid in jobs.notes(log)]
    _killed(grandchild)


@pytest.mark.parametrize("session", [False, pytest.param(True, marks=LINUX)], ids=["in its group", "own session"])
def test_a_grandchild_is_killed_when_the_worker_is_stopped_during_its_attempt(
    manager: QueueManager, memory: MemoryQueue, log: str, session: bool
) -> None:
    manager.dispatch(jobs.ForksUnhurried(log=log, session=session))
    worker = Worker(manager, options=WorkerOptions(concurrency=1, grace=0.2))
    worker.start()
    try:
        wait_until(lambda: bool(jobs.notes(log)), timeout=10, message="the job to start its grandchild")
    finally:
        worker.stop()
        stats = worker.join(10)
    assert stats.interrupted == 1
    [grandchild] = [int(pid) for pid in jobs.notes(log)]
    _killed(grandchild)


@LINUX
def test_a_daemon_the_job_started_stays_under_its_child_and_is_killed_with_it(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Daemonizes(log=log))
    stats = run_once(manager, concurrency=1)
    assert stats.failed == 1
    [line] = jobs.notes(log)
    orphan, parent, child = (int(pid) for pid in line.split())
    _killed(orphan)
    assert parent == child, "orphaned while the job ran, it was adopted by the job's child process"


@LINUX
def test_what_a_retired_child_left_running_is_killed_while_the_worker_runs(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Forks(log=log, overrun=False, session=True))
    worker = Worker(manager, options=WorkerOptions(concurrency=1, max_jobs_per_child=1))
    worker.start()
    try:
        wait_until(lambda: worker.stats.processed == 1, timeout=10, message="the job")
        [grandchild] = [int(pid) for pid in jobs.notes(log)]
        _killed(grandchild)
        assert worker._thread is not None and worker._thread.is_alive()
    finally:
        worker.stop()
        worker.join(10)


@LINUX
def test_a_child_reaps_what_it_adopted_between_attempts(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    manager.dispatch(jobs.LeavesAZombie(log=log))
    manager.dispatch(jobs.LeavesAZombie(log=log, look=True))
    stats = run_once(manager, concurrency=1)
    assert stats.processed == 2
    assert jobs.notes(log)[1] == "False", "the exited orphan was reaped before the next attempt"


def test_middleware_runs_in_the_worker_around_an_attempt_in_a_child(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch_many([jobs.TimedLimited(log=log), jobs.TimedLimited(log=log)])
    stats = run_once(manager, concurrency=1)
    assert (stats.processed, stats.deferred) == (1, 1), "one a minute: the second is deferred, not run"
    [pid] = jobs.notes(log)
    assert int(pid) != os.getpid(), "the job itself ran in a child"
    [waiting] = memory.jobs
    assert waiting.attempts == 0


def test_a_failure_in_a_child_reaches_the_workers_middleware(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    assert manager.locks is not None
    manager.dispatch(jobs.TimedThrottled(log=log))
    stats = run_once(manager, concurrency=1)
    assert stats.released == 1 and len(jobs.notes(log)) == 1
    assert manager.locks.counted(f"throttle:{jobs.TimedThrottled.NAME}")[0] == 1


def test_memory_limit_caps_the_child(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    info = survives(manager, memory, jobs.Hog(megabytes=2048), log)
    assert info.kind == "MemoryError"
    manager.dispatch(jobs.Hog(megabytes=16))
    assert run_once(manager, concurrency=1).processed == 1


def test_a_job_in_a_child_dispatches_through_the_worker_manager(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.Dispatcher(log=log))
    stats = run_once(manager, concurrency=1)
    # the follow-up reached the worker's own queue (not the child's copy of it),
    # and the unique lock store deduplicated the second dispatch
    assert stats.processed == 2 and memory.size() == 0
    lines = jobs.notes(log)
    assert lines[0] == "dispatched True True"
    assert lines[1].startswith("once-only ") and int(lines[1].split()[1]) == os.getpid()


def test_child_setup_gives_children_their_own_container(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    manager.dispatch(jobs.FromContainer(log=log))
    stats = run_once(manager, concurrency=1, child_setup="tests.timeouts.jobs:child_setup")
    assert stats.processed == 1
    where = jobs.notes(log)[0]
    assert where.startswith("child-setup in ") and int(where.rsplit(" ", 1)[1]) != os.getpid()


def test_a_failing_child_setup_fails_the_attempt_with_its_error(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch(jobs.FromContainer(log=log))
    stats = run_once(manager, concurrency=1, child_setup="tests.timeouts.jobs:broken_child_setup")
    assert stats.failed == 1 and jobs.notes(log) == []
    assert memory.failed[0].error == "RuntimeError: no database in this child"


def test_a_fork_server_killed_by_hand_is_replaced(manager: QueueManager, memory: MemoryQueue, log: str) -> None:
    worker = Worker(manager, options=WorkerOptions(concurrency=1))
    worker.start()
    try:
        wait_until(lambda: worker.attempts.supervisor is not None, timeout=10, message="the fork server")
        supervisor = worker.attempts.supervisor
        assert supervisor is not None and supervisor._server_pid is not None
        os.kill(supervisor._server_pid, signal.SIGKILL)
        wait_until(lambda: supervisor._server_pid is None, timeout=10, message="the worker to notice")
        manager.dispatch(jobs.Noop(log=log))
        wait_until(lambda: worker.stats.processed == 1, timeout=10, message="the job, in a child of a new server")
    finally:
        worker.stop()
        worker.join(10)
    assert int(jobs.notes(log)[0]) != os.getpid()


@pytest.mark.parametrize(
    "value, fault",
    [
        ("tests.timeouts.jobs", "package.module:function"),
        ("tests.nowhere:f", "cannot import"),
        ("tests.timeouts.jobs:nope", "has no"),
    ],
)
def test_a_bad_child_setup_fails_at_boot(value: str, fault: str) -> None:
    with pytest.raises(ConfigurationError, match=fault):
        WorkerOptions(child_setup=value)


def test_children_and_the_fork_server_are_gone_after_the_worker_stops(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.dispatch_many([jobs.Noop(log=log) for _ in range(4)])
    worker = Worker(manager, options=WorkerOptions(concurrency=2))
    worker.start()
    wait_until(lambda: worker.stats.processed == 4, timeout=10, message="four jobs")
    supervisor = worker.attempts.supervisor
    assert supervisor is not None
    children = supervisor.pids()
    server = supervisor._server_pid
    assert children and server
    worker.stop()
    worker.join(10)

    def gone(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped by init

    wait_until(lambda: all(gone(pid) for pid in [*children, server]), timeout=10, message="the children to exit")


def test_a_function_job_with_a_time_limit_runs_in_a_child_and_keeps_its_result(
    manager: QueueManager, memory: MemoryQueue, log: str
) -> None:
    manager.registry.register(jobs.note_pid)
    job_id = manager.dispatch(jobs.note_pid(log))
    assert job_id is not None
    stats = run_once(manager)
    assert (stats.processed, stats.failed) == (1, 0)
    [pid] = [int(line) for line in jobs.notes(log)]
    assert pid != os.getpid()
    assert memory.failed == []
    assert manager.result(job_id).value == pid, "what the function returned in its child"
