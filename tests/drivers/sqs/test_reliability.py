"""What survives: a worker killed mid-job, an endpoint that goes away mid-drain."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from rainier_sync import QueueManager, Worker, WorkerOptions, signals
from tests.services.moto import MotoServer
from tests.support import wait_until

from . import jobs
from .conftest import Queues
from .jobs import Marked, Note
from .test_driver import job

pytestmark = [pytest.mark.sqs, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[3]


def lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_worker_killed_mid_job_leaves_the_job_to_run_again(
    queues: Queues, manager_for: Callable[..., QueueManager], tmp_path: pathlib.Path
) -> None:
    q = queues.driver(visibility_timeout=2)
    manager = manager_for(q)
    manager.dispatch(Marked(directory=str(tmp_path)))
    log = tmp_path / "log"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.drivers.sqs.worker_process", queues.endpoint, q.queue_urls["default"],
         q.failed_queue_url, "2"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        wait_until(lambda: any(line.startswith("start 1") for line in lines(log)), timeout=20, interval=0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    (tmp_path / "go").touch()
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=0.2))
    worker.start()
    try:
        wait_until(lambda: worker.stats.processed == 1, timeout=15, message="the job to run again and finish")
    finally:
        worker.stop()
        worker.join(timeout=5)
    record = lines(log)
    assert [line.split()[:2] for line in record] == [["start", "1"], ["start", "2"], ["done", "2"]]
    assert record[0].split()[2] == str(child.pid)
    assert q.size("default") == 0 and q.failed_count() == 0


def test_the_endpoint_going_away_mid_drain_is_reported_and_survived(
    moto_server_process: MotoServer, manager_for: Callable[..., QueueManager]
) -> None:
    queues = Queues(moto_server_process.url)
    try:
        q = queues.driver(visibility_timeout=5, wait_time=1)
        manager = manager_for(q)
        total = 60
        manager.dispatch_many([Note(tag=f"n{i}", seconds=0.02) for i in range(total)])
        failures: list[dict[str, Any]] = []

        def on_failure(sender: Any, **kw: Any) -> None:
            failures.append(kw)

        def done() -> set[str]:
            with jobs.lock:
                return {tag for tag, _ in jobs.runs}

        signals.queue_operation_failed.connect(on_failure)
        worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=4, sleep=0.2))
        worker.start()
        try:
            wait_until(lambda: len(done()) >= 10, timeout=20, message="the drain to get going")
            moto_server_process.stop()
            wait_until(lambda: len(failures) >= 2, timeout=30, message="queue_operation_failed signals")
            during = len(done())
            time.sleep(1.0)  # the worker keeps trying (with its backoff) while the endpoint is gone
            assert worker._thread is not None and worker._thread.is_alive()
            moto_server_process.start()
            wait_until(lambda: len(done()) == total, timeout=40, message="every job to run after the restart")
            wait_until(lambda: q.size("default") == 0, timeout=20, message="the queue to empty")
        finally:
            worker.stop()
            worker.join(timeout=10)
            signals.queue_operation_failed.disconnect(on_failure)
        assert during < total, "the outage should have come mid-drain"
        assert {f["operation"] for f in failures} & {"reserve", "settle", "wait_for_jobs", "extend"}
        assert all(f["connection"] == "sqs" and f["error"] for f in failures)
        assert "testing" not in " ".join(f["error"] for f in failures)
        assert q.failed_count() == 0
    finally:
        if not moto_server_process.running:
            moto_server_process.start()
        queues.cleanup()


_IDLE_THEN_EXIT = """
import sys
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.sqs import SqsQueue
q = SqsQueue(sys.argv[2], failed_queue_url=sys.argv[3], endpoint=sys.argv[1], region="us-east-1",
             key="testing", secret="testing", visibility_timeout=3, wait_time=5)
q.wait_for_jobs(["default"], 0.5, Waker())  # idle: a long poll starts, then the worker stops
print("exiting", flush=True)
"""


def test_a_job_dispatched_while_an_exiting_worker_long_polls_is_handed_back(queues: Queues) -> None:
    q = queues.driver(visibility_timeout=3)
    child = subprocess.Popen(
        [sys.executable, "-c", _IDLE_THEN_EXIT, queues.endpoint, q.queue_urls["default"], q.failed_queue_url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "exiting"
    dispatched = job(tries=1)
    q.push(dispatched)  # the exiting process's poll is still open on the server: it receives this
    assert child.wait(timeout=30) == 0
    got = q.reserve_many(["default"], 1)
    # Handed back at exit, not left hidden to come back as attempt 2 of 1 (failed unrun).
    assert [j.id for j in got] == [dispatched.id] and got[0].attempts == 1
    q.acknowledge_many(got)
    assert q.failed_jobs(5) == []
