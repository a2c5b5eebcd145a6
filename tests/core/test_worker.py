from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from freezegun import freeze_time

from rainier_sync import (
    ConfigurationError,
    Container,
    Job,
    JobContext,
    JobRegistry,
    QueuedJob,
    QueueManager,
    Worker,
    WorkerOptions,
    signals,
)
from rainier_sync.drivers import MemoryQueue
from tests.support import wait_until

from . import jobs


def once(manager: QueueManager, **options: Any) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, **options)).run()


def test_a_once_worker_runs_what_is_due_and_returns(manager: QueueManager, memory: MemoryQueue) -> None:
    manager.dispatch_many([jobs.Record(i) for i in range(20)])
    stats = once(manager)
    assert stats.processed == 20 and stats.failed == 0
    assert sorted(v for _, v in jobs.calls) == list(range(20))
    assert memory.size() == 0


def test_concurrency_runs_jobs_on_that_many_threads(registry: JobRegistry, memory: MemoryQueue) -> None:
    barrier = threading.Barrier(4, timeout=5)

    @dataclass
    class Meet(Job):
        NAME = "tests.meet"

        def handle(self, context: JobContext) -> None:
            barrier.wait()  # only passes when 4 run at the same time
            jobs.calls.append(("meet", threading.current_thread().name))

    registry.register(Meet)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    manager.dispatch_many([Meet() for _ in range(4)])
    stats = once(manager, concurrency=4)
    assert stats.processed == 4
    assert len({name for _, name in jobs.calls}) == 4


def test_queues_are_worked_in_the_order_given(manager: QueueManager) -> None:
    for i in range(3):
        manager.dispatch_on("low", jobs.Record(f"low{i}"))
    for i in range(3):
        manager.dispatch_on("high", jobs.Record(f"high{i}"))
    once(manager, queues=["high", "low"], concurrency=1)
    assert [v for _, v in jobs.calls] == ["high0", "high1", "high2", "low0", "low1", "low2"]


def test_max_jobs_stops_after_that_many(manager: QueueManager, memory: MemoryQueue) -> None:
    manager.dispatch_many([jobs.Record(i) for i in range(10)])
    stats = Worker(manager, options=WorkerOptions(max_jobs=4, concurrency=2, sleep=5)).run()
    assert stats.processed == 4
    assert memory.size() == 6


def test_release_with_backoff_then_fail_and_failed_runs_once(manager: QueueManager, memory: MemoryQueue) -> None:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        manager.dispatch(jobs.Flaky())  # TRIES=3, fixed(5) backoff
        assert once(manager).released == 1
        assert once(manager).processed == 0, "not due before its backoff"
        frozen.tick(5)
        assert once(manager).released == 1
        frozen.tick(5)
        assert once(manager).failed == 1
    assert [c for c in jobs.calls if c[0] == "flaky"] == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert len(jobs.Flaky.failed_calls) == 1
    (failed,) = memory.failed
    assert failed.error == "RuntimeError: attempt 3 failed"
    assert failed.exception.causes == (("OSError", "upstream down"),)
    assert "Traceback" in failed.exception.traceback


def test_an_unknown_job_name_is_failed_naming_it_and_the_worker_goes_on(
    manager: QueueManager, memory: MemoryQueue
) -> None:
    memory.push(QueuedJob(id="ghost-1", name="tests.ghost", queue="default", payload={}, max_attempts=5))
    manager.dispatch(jobs.Record("after"))
    stats = once(manager, concurrency=1)
    assert stats.failed == 1 and stats.processed == 1
    assert "no job named 'tests.ghost'" in memory.failed[0].error
    assert memory.failed[0].attempts == 1, "an unknown job is not retried"


def test_a_payload_that_does_not_fit_is_failed_without_retries(manager: QueueManager, memory: MemoryQueue) -> None:
    memory.push(QueuedJob(id="bad-1", name="tests.record", queue="default", payload={"nope": 1}, max_attempts=5))
    assert once(manager).failed == 1
    assert "payload does not fit" in memory.failed[0].error


def test_a_base_exception_fails_the_attempt_not_the_worker(manager: QueueManager, memory: MemoryQueue) -> None:
    manager.dispatch(jobs.Weird())
    manager.dispatch(jobs.Record("next"))
    stats = once(manager, concurrency=1)
    assert stats.failed == 1 and stats.processed == 1
    assert memory.failed[0].error == "GeneratorExit: odd but survivable"


def test_a_failed_hook_that_raises_is_logged_and_swallowed(
    manager: QueueManager, memory: MemoryQueue, caplog: pytest.LogCaptureFixture
) -> None:
    manager.dispatch(jobs.BrokenFailed())
    with caplog.at_level(logging.ERROR, logger="rainier_sync"):
        stats = once(manager)
    assert stats.failed == 1
    assert memory.failed[0].error == "ValueError: first"
    assert any("failed() raised" in r.getMessage() for r in caplog.records)


def test_signals_carry_error_and_exception_and_a_raising_listener_is_harmless(
    manager: QueueManager, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, Any]] = []

    def broken(sender: Any, **kw: Any) -> None:
        raise RuntimeError("listener broke")

    def record(name: str) -> Any:
        def receiver(sender: Any, **kw: Any) -> None:
            seen.append((name, kw))

        return receiver

    receivers = {name: record(name) for name in ("processing", "processed", "released", "failed", "attempt")}
    signals.job_processing.connect(broken)
    signals.job_processing.connect(receivers["processing"])
    signals.job_processed.connect(receivers["processed"])
    signals.job_released.connect(receivers["released"])
    signals.job_failed.connect(receivers["failed"])
    signals.job_attempt_failed.connect(receivers["attempt"])
    try:
        with freeze_time("2026-01-01") as frozen, caplog.at_level(logging.ERROR, logger="rainier_sync"):
            manager.dispatch(jobs.Record("ok"))
            manager.dispatch(jobs.Flaky())
            for _ in range(3):
                once(manager, concurrency=1)
                frozen.tick(5)
    finally:
        signals.job_processing.disconnect(broken)
        for name, signal_ in (("processing", signals.job_processing), ("processed", signals.job_processed),
                              ("released", signals.job_released), ("failed", signals.job_failed),
                              ("attempt", signals.job_attempt_failed)):
            signal_.disconnect(receivers[name])
    names = [n for n, _ in seen]
    assert names.count("processing") == 4, "the raising listener did not stop the next one"
    assert names.count("processed") == 1
    assert names.count("released") == 2 and names.count("failed") == 1 and names.count("attempt") == 3
    failed = next(kw for n, kw in seen if n == "failed")
    assert failed["error"] == "RuntimeError: attempt 3 failed"
    assert failed["exception"].kind == "RuntimeError"
    assert failed["exception"].causes == (("OSError", "upstream down"),)
    assert failed["exception"].timed_out is False and failed["exception"].crashed is False
    final = [kw["final_attempt"] for n, kw in seen if n == "attempt"]
    assert final == [False, False, True]
    assert any("receiver of job-processing raised" in r.getMessage() for r in caplog.records)


def test_scoped_bindings_are_flushed_between_jobs(registry: JobRegistry, memory: MemoryQueue) -> None:
    made: list[object] = []

    class Session:
        def __init__(self) -> None:
            made.append(self)

    @dataclass
    class UsesSession(Job):
        NAME = "tests.uses-session"

        def handle(self, context: JobContext) -> None:
            assert context.resolve(Session) is context.resolve(Session)

    registry.register(UsesSession)
    container = Container().scoped(Session, lambda: Session())
    manager = QueueManager({"m": memory}, registry=registry, container=container)
    manager.dispatch_many([UsesSession() for _ in range(3)])
    assert once(manager, concurrency=1).processed == 3
    assert len(made) == 3, "each job gets its own scoped object"


def test_an_embedded_worker_wakes_at_once_and_stops_gracefully(manager: QueueManager,
                                                                memory: MemoryQueue) -> None:
    worker = Worker(manager, options=WorkerOptions(concurrency=2, sleep=60))
    worker.start()
    try:
        wait_until(lambda: worker.stats.idles >= 1, 5, message="the worker to go idle")
        manager.dispatch(jobs.Blocking("one"))
        assert jobs.Blocking.started.setdefault("one", threading.Event()).wait(5), \
            "an idle worker must start a new job without waiting out its 60 s sleep"
        worker.stop()
        manager.dispatch(jobs.Record("not taken"))
        time.sleep(0.05)
        assert worker._thread is not None and worker._thread.is_alive(), "a running job is allowed to finish"
        jobs.Blocking.events.setdefault("one", threading.Event()).set()
        stats = worker.join(5)
    finally:
        worker.stop(grace=0)
    assert worker._thread is not None and not worker._thread.is_alive()
    assert stats.processed == 1
    assert jobs.calls == [], "no job is taken after stop()"
    assert memory.size() == 1


def test_stop_requested_is_set_for_running_jobs(registry: JobRegistry, memory: MemoryQueue) -> None:
    seen = threading.Event()

    @dataclass
    class Cooperative(Job):
        NAME = "tests.cooperative"

        def handle(self, context: JobContext) -> None:
            jobs.Blocking.started.setdefault("coop", threading.Event()).set()
            if context.stop_requested.wait(5):
                seen.set()

    registry.register(Cooperative)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=1))
    worker.start()
    manager.dispatch(Cooperative())
    assert jobs.Blocking.started.setdefault("coop", threading.Event()).wait(5)
    worker.stop()
    worker.join(5)
    assert seen.is_set()


def test_heartbeats_keep_a_long_job_from_a_second_worker(registry: JobRegistry) -> None:
    memory = MemoryQueue(reservation=0.3)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    manager.dispatch(jobs.Blocking("long"))
    first = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05, reclaim_interval=0.05))
    second = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05, reclaim_interval=0.05))
    first.start()
    assert jobs.Blocking.started.setdefault("long", threading.Event()).wait(5)
    second.start()
    time.sleep(1.0)  # three reservations long: without heartbeats the second worker would reclaim it
    jobs.Blocking.events.setdefault("long", threading.Event()).set()
    wait_until(lambda: memory.size() == 0, 5, message="the job to be acknowledged")
    first.stop()
    second.stop()
    s1, s2 = first.join(5), second.join(5)
    assert (s1.processed, s2.processed) == (1, 0)


def test_a_job_whose_worker_died_is_reclaimed_when_its_reservation_lapses(manager: QueueManager,
                                                                         memory: MemoryQueue) -> None:
    with freeze_time("2026-01-01") as frozen:
        manager.pending(jobs.Record("orphan")).tries(2).send()  # the lost attempt spends one of the two
        assert memory.reserve(["default"]) is not None  # a worker took it, then died
        assert once(manager).processed == 0
        frozen.tick(31)
        stats = once(manager)
    assert stats.processed == 1
    assert jobs.calls == [("record", "orphan")]


def test_a_once_worker_inside_freeze_time_sees_frozen_time_in_its_threads(manager: QueueManager) -> None:
    with freeze_time("2030-06-01 12:00:00") as frozen:
        manager.dispatch_after(3600, jobs.Record("later"))
        assert once(manager, concurrency=4).processed == 0
        frozen.tick(3599)
        assert once(manager, concurrency=4).processed == 0
        frozen.tick(1)
        assert once(manager, concurrency=4).processed == 1


def test_worker_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="concurrency"):
        WorkerOptions(concurrency=0)
    with pytest.raises(ConfigurationError, match="queues"):
        WorkerOptions(queues=[])
    with pytest.raises(ConfigurationError, match="sleep"):
        WorkerOptions(sleep=-1)
    with pytest.raises(ConfigurationError, match="max_jobs"):
        WorkerOptions(max_jobs=0)
    assert WorkerOptions(queues="high,default").queues == ["high", "default"]


def test_a_reserve_that_raises_is_reported_and_retried(manager: QueueManager, memory: MemoryQueue,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[str] = []

    def on_failure(sender: Any, **kw: Any) -> None:
        reported.append(kw["operation"])

    real = memory.reserve_many
    calls = {"n": 0}

    def flaky_reserve(queues: Any, limit: int) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("backend blinked")
        return real(queues, limit)

    monkeypatch.setattr(memory, "reserve_many", flaky_reserve)
    manager.dispatch(jobs.Record("survivor"))
    signals.queue_operation_failed.connect(on_failure)
    try:
        stats = once(manager)
    finally:
        signals.queue_operation_failed.disconnect(on_failure)
    assert reported == ["reserve", "reserve"]
    assert stats.processed == 1


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from dataclasses import dataclass
    from rainier_sync import Container, Job, JobRegistry, QueueManager, Worker, WorkerOptions
    from rainier_sync.drivers import MemoryQueue

    release = threading.Event()

    @dataclass
    class Slow(Job):
        NAME = "slow"
        def handle(self, context):
            print("started", flush=True)
            context.stop_requested.wait(10)
            print("finishing", flush=True)

    manager = QueueManager({"m": MemoryQueue()}, registry=JobRegistry().with_job(Slow), container=Container())
    manager.dispatch(Slow())
    manager.dispatch(Slow())
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.1))
    worker.install_signal_handlers()
    stats = worker.run()
    print("stopped", stats.processed, manager.connection().size(), flush=True)
    """
)


def test_sigterm_stops_a_worker_gracefully() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert out.split() == ["finishing", "stopped", "1", "1"], out


def test_a_once_worker_gives_up_on_a_backend_that_keeps_failing(manager: QueueManager, memory: MemoryQueue,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from rainier_sync.errors import QueueUnavailableError

    def down(queues: Any, limit: int) -> Any:
        raise ConnectionError("connection refused")

    monkeypatch.setattr(memory, "reserve_many", down)
    started = time.monotonic()
    with pytest.raises(QueueUnavailableError, match=r"kept failing for 0\.[3-9].*reserve: ConnectionError"):
        once(manager, give_up=0.3)
    assert time.monotonic() - started < 10


def test_a_once_worker_counts_every_failing_operation_towards_giving_up(
    manager: QueueManager, memory: MemoryQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rainier_sync.errors import QueueUnavailableError

    # One thread, busy with a long job: the loop claims nothing, but its heartbeats
    # fail. Those failures count, so the run ends instead of waiting on the job.
    def down(jobs: Any, seconds: Any = None) -> None:
        raise ConnectionError("connection refused")

    memory.reservation = 0.09  # a heartbeat every 30 ms
    monkeypatch.setattr(memory, "extend", down)
    manager.dispatch(jobs.Blocking("held"))
    raised: list[BaseException] = []

    def run() -> None:
        try:
            once(manager, give_up=0.2, concurrency=1)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            raised.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert jobs.Blocking.started.setdefault("held", threading.Event()).wait(5)
        runner.join(10)
    finally:
        jobs.Blocking.events.setdefault("held", threading.Event()).set()
    assert not runner.is_alive(), "the run waited on its job while the backend kept failing"
    assert len(raised) == 1 and isinstance(raised[0], QueueUnavailableError)
    assert "extend: ConnectionError" in str(raised[0])


def test_a_once_worker_rides_out_a_short_blip(manager: QueueManager, memory: MemoryQueue,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = memory.reserve_many
    failing = {"n": 4}

    def blip(queues: Any, limit: int) -> Any:
        if failing["n"]:
            failing["n"] -= 1
            raise ConnectionError("connection reset")
        return real(queues, limit)

    monkeypatch.setattr(memory, "reserve_many", blip)
    manager.dispatch(jobs.Record("after the blip"))
    stats = once(manager, give_up=30)
    assert stats.processed == 1 and failing["n"] == 0


def test_an_idle_worker_sleeps_instead_of_spinning(manager: QueueManager, memory: MemoryQueue,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    memory.reservation = 0.09  # a heartbeat every 30 ms
    calls = {"n": 0}
    real = memory.reserve_many

    def counting(queues: Any, limit: int) -> Any:
        calls["n"] += 1
        return real(queues, limit)

    monkeypatch.setattr(memory, "reserve_many", counting)
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.1))
    worker.start()
    time.sleep(0.5)
    worker.stop()
    worker.join(5)
    assert calls["n"] <= 15, f"an idle worker polled {calls['n']} times in 0.5 s with sleep=0.1"


def test_heartbeats_go_on_while_acknowledgements_fail(registry: JobRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = MemoryQueue(reservation=0.3)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    real_ack = memory.acknowledge_many
    failing_until = time.monotonic() + 10**6

    def flaky_ack(jobs_: Any) -> None:
        if time.monotonic() < failing_until:
            raise ConnectionError("acknowledge lost")
        real_ack(jobs_)

    monkeypatch.setattr(memory, "acknowledge_many", flaky_ack)
    manager.dispatch(jobs.Record("once only"))
    first = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05))
    second = Worker(manager, options=WorkerOptions(concurrency=1, sleep=0.05, reclaim_interval=0.05))
    first.start()
    wait_until(lambda: jobs.calls == [("record", "once only")], 5, message="the job to run")
    second.start()
    time.sleep(1.2)  # four reservations long, with every acknowledgement failing
    failing_until = time.monotonic()
    wait_until(lambda: memory.size() == 0, 10, message="the acknowledgement to go through")
    for worker in (first, second):
        worker.stop()
        worker.join(5)
    assert jobs.calls == [("record", "once only")], "the job ran again while its worker was alive"


def test_the_health_file_option_is_checked(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="health_file .*does not exist"):
        WorkerOptions(health_file=str(tmp_path / "missing" / "worker.alive"))
    with pytest.raises(ConfigurationError, match="health_file"):
        WorkerOptions(health_file=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="health_file .*is a directory"):
        WorkerOptions(health_file=str(tmp_path))
    assert WorkerOptions(health_file=tmp_path / "worker.alive").health_file == str(tmp_path / "worker.alive")


def test_health_reports_the_loop_the_running_jobs_and_the_backend(
    manager: QueueManager, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alive = tmp_path / "worker.alive"
    worker = Worker(manager, options=WorkerOptions(concurrency=2, sleep=0.05, health_file=str(alive)))
    assert worker.health().last_turn_age is None, "no turn before the worker runs"
    worker.start()
    try:
        wait_until(alive.exists, 5, message="the worker to touch its health file")
        manager.dispatch(jobs.Blocking("held"))
        assert jobs.Blocking.started.setdefault("held", threading.Event()).wait(5)
        health = worker.health()
        assert health.running == 1 and health.held == 1
        assert health.last_turn_age is not None and health.last_turn_age < 5
        assert not health.stopping and health.last_error == "" and health.failing_since is None
        jobs.Blocking.events.setdefault("held", threading.Event()).set()
        wait_until(lambda: worker.health().held == 0, 5, message="the job to be settled")

        def down(*args: Any) -> Any:
            raise ConnectionError("backend away")

        before = time.time()
        monkeypatch.setattr(manager.connection(), "reserve_many", down)
        monkeypatch.setattr(manager.connection(), "acknowledge_and_reserve", down, raising=False)
        wait_until(lambda: worker.health().failing_since is not None, 5, message="a failed claim")
        health = worker.health()
        assert "backend away" in health.last_error
        assert health.failing_since is not None and before - 1 <= health.failing_since <= time.time() + 1
        worker.stop()
        assert worker.health().stopping
    finally:
        worker.stop(grace=0)
        worker.join(5)


class WedgedQueue(MemoryQueue):
    """A backend whose wait for jobs hangs until ``release`` is set: the loop stops turning."""

    def __init__(self) -> None:
        super().__init__(reservation=30)
        self.entered = threading.Event()
        self.release = threading.Event()

    def wait_for_jobs(self, queues: Any, timeout: float, waker: Any) -> None:
        self.entered.set()
        self.release.wait(10)


def test_a_wedged_loop_fails_the_liveness_probe_while_a_healthy_one_passes(
    registry: JobRegistry, tmp_path: Any
) -> None:
    from rainier_sync.cli import EXIT_FAILURE, EXIT_OK, main

    wedged_queue = WedgedQueue()
    wedged_file, healthy_file = tmp_path / "wedged.alive", tmp_path / "healthy.alive"
    wedged = Worker(
        QueueManager({"main": wedged_queue}, registry=registry),
        options=WorkerOptions(sleep=0.05, health_file=str(wedged_file)),
    )
    healthy = Worker(
        QueueManager({"main": MemoryQueue()}, registry=registry),
        options=WorkerOptions(sleep=0.05, health_file=str(healthy_file)),
    )
    wedged.start()
    healthy.start()
    try:
        assert wedged_queue.entered.wait(5), "the wedged worker's loop to hang"
        wait_until(healthy_file.exists, 5, message="the healthy worker to touch its file")
        # Both files look a minute old; only a loop that still turns touches its file again.
        a_minute_ago = time.time() - 60
        for path in (wedged_file, healthy_file):
            os.utime(path, (a_minute_ago, a_minute_ago))
        wait_until(lambda: healthy_file.stat().st_mtime > a_minute_ago, 5, message="the healthy worker to touch again")
        assert main(["queue:health", "--health-file", str(healthy_file), "--max-age", "30"]) == EXIT_OK
        assert main(["queue:health", "--health-file", str(wedged_file), "--max-age", "30"]) == EXIT_FAILURE
        wait_until(lambda: (wedged.health().last_turn_age or 0) > 0.2, 5, message="the wedged loop to age")
        assert (healthy.health().last_turn_age or 0) < (wedged.health().last_turn_age or 0)
    finally:
        wedged_queue.release.set()
        for worker in (wedged, healthy):
            worker.stop(grace=0)
            worker.join(5)


def test_a_busy_worker_with_long_jobs_keeps_its_health_file_fresh(manager: QueueManager, tmp_path: Any) -> None:
    alive = tmp_path / "worker.alive"
    # Every thread busy and a 60 s sleep: the loop would otherwise wait for its next heartbeat (10 s).
    worker = Worker(manager, options=WorkerOptions(concurrency=1, sleep=60, health_file=str(alive)))
    worker.start()
    try:
        manager.dispatch(jobs.Blocking("long"))
        assert jobs.Blocking.started.setdefault("long", threading.Event()).wait(5)
        a_minute_ago = time.time() - 60
        os.utime(alive, (a_minute_ago, a_minute_ago))
        wait_until(lambda: alive.stat().st_mtime > a_minute_ago, 5, message="the busy loop to touch the file")
        assert worker.health().running == 1
    finally:
        jobs.Blocking.events.setdefault("long", threading.Event()).set()
        worker.stop(grace=0)
        worker.join(5)
