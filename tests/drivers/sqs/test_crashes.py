"""Worker processes killed mid-drain, and stopped with jobs claimed ahead:
nothing is lost, re-runs stay within what was in flight, nothing unstarted is failed."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from collections import Counter
from typing import Callable, Iterator

import pytest

from rainier_sync import QueueManager, WorkerOptions
from rainier_sync.drivers.sqs import SqsQueue
from tests.services.moto import in_flight_now
from tests.support import wait_until

from .conftest import Queues
from .jobs import Ledger, OneTry

pytestmark = [pytest.mark.sqs, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONCURRENCY = 4


class Workers:
    """Worker processes (tests.drivers.sqs.worker_process) on one driver's queues."""

    def __init__(self, endpoint: str, q: SqsQueue, visibility: float, concurrency: int) -> None:
        others = {name: url for name, url in q.queue_urls.items() if name != "default"}
        self.command = [
            sys.executable, "-m", "tests.drivers.sqs.worker_process", endpoint, q.queue_urls["default"],
            q.failed_queue_url, str(visibility), "--queue-urls", json.dumps(others), "--concurrency", str(concurrency),
        ]  # fmt: skip
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, count: int = 1) -> list[subprocess.Popen[str]]:
        started = [
            subprocess.Popen(
                self.command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True
            )
            for _ in range(count)
        ]
        self.procs.extend(started)
        return started

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()
        self.procs = []

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.kill_all()


@pytest.fixture
def workers_for(queues: Queues) -> Iterator[Callable[..., Workers]]:
    made: list[Workers] = []

    def build(q: SqsQueue, visibility: float, concurrency: int = CONCURRENCY) -> Workers:
        workers = Workers(queues.endpoint, q, visibility, concurrency)
        made.append(workers)
        return workers

    yield build
    for workers in made:
        workers.kill_all()


def ledger(path: pathlib.Path) -> list[int]:
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


def in_flight(q: SqsQueue, before: set[tuple[str, str]]) -> tuple[int, set[tuple[str, str]]]:
    """How many messages are received and neither deleted nor visible again,
    leaving out those still hidden since ``before`` (the last kill) and not
    received since; and the messages, for the next call."""
    now = in_flight_now(q.queue_urls.values())
    if now is None:  # moto elsewhere: SQS's counts, which may count the last kill's again
        return sum(q.counts(name).reserved for name in q.queue_names()), set()
    return len(now - before), now


def test_three_kill_9s_mid_drain_lose_nothing_and_rerun_at_most_what_was_in_flight(
    queues: Queues,
    manager_for: Callable[..., QueueManager],
    workers_for: Callable[..., Workers],
    tmp_path: pathlib.Path,
) -> None:
    total, processes, visibility = 1000, 2, 8
    # moto slows with a queue's depth, so the thousand jobs are spread over twenty queues.
    names = tuple(f"q{i}" for i in range(1, 20))
    q = queues.driver(queues=names, visibility_timeout=visibility)
    manager = manager_for(q)
    path = tmp_path / "ledger"
    built = [
        manager.build(Ledger(path=str(path), n=n), queue=("default", *names)[n % 20], connection="sqs")
        for n in range(total)
    ]
    q.push_many(built)
    workers = workers_for(q, visibility)
    workers.start(processes)
    held_at_kill: list[int] = []
    hidden: set[tuple[str, str]] = set()
    for kill in range(3):
        target = (kill + 1) * total // 5
        reached = lambda target=target: len(ledger(path)) >= target  # noqa: E731
        wait_until(reached, timeout=60, interval=0.05, message=f"{target} jobs run")
        workers.kill_all()
        held, hidden = in_flight(q, hidden)
        held_at_kill.append(held)
        assert len(set(ledger(path))) < total, "the kill came after the drain"
        workers.start(processes)
    wait_until(
        lambda: len(set(ledger(path))) == total, timeout=60, interval=0.2, message="every job to run after the kills"
    )
    wait_until(lambda: q.size() == 0, timeout=30, interval=0.2, message="every queue to empty")
    workers.stop_all()
    runs = Counter(ledger(path))
    assert set(runs) == set(range(total)), "lost: " + str(sorted(set(range(total)) - set(runs))[:20])
    reruns = sum(runs.values()) - total
    # The bound the docs state: a kill re-runs at most what the killed workers held.
    assert reruns <= sum(held_at_kill), (reruns, held_at_kill)
    # What a worker holds: its claims (threads and prefetch), or while idle one long-polled message per queue.
    capacity = CONCURRENCY + WorkerOptions(concurrency=CONCURRENCY).most_ahead
    assert all(held <= processes * (capacity + len(q.queue_urls)) for held in held_at_kill), held_at_kill
    assert q.failed_count() == 0


def test_sigterm_hands_back_tries_1_jobs_claimed_ahead_and_none_is_failed(
    queues: Queues,
    manager_for: Callable[..., QueueManager],
    workers_for: Callable[..., Workers],
    tmp_path: pathlib.Path,
) -> None:
    q = queues.driver(visibility_timeout=30)
    manager = manager_for(q)
    path, hold = tmp_path / "ledger", tmp_path / "go"
    # Quick jobs (so the worker measures a short pace and claims ahead), then one
    # that holds the only thread, then more: claimed ahead behind it, unstarted.
    jobs = [OneTry(path=str(path), n=n, hold=str(hold) if n == 20 else "") for n in range(60)]
    q.push_many([manager.build(job, connection="sqs") for job in jobs])
    workers = workers_for(q, 30, concurrency=1)
    (proc,) = workers.start(1)
    started = pathlib.Path(str(hold) + ".started")
    wait_until(started.exists, timeout=30, interval=0.05, message="the holding job to start")
    claimed_behind = lambda: in_flight(q, set())[0] >= 2  # noqa: E731 - the holding job and one claimed ahead
    wait_until(claimed_behind, timeout=20, interval=0.05, message="jobs claimed behind the holding one")
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None
    safety = threading.Timer(15, hold.touch)  # should nothing be handed back, the worker still ends
    safety.start()
    try:
        line = proc.stdout.readline().strip()
    finally:
        safety.cancel()
    assert line.startswith("gave back "), line
    handed_back = int(line.split()[2])
    assert handed_back >= 1
    hold.touch()  # the running job finishes within the grace period
    assert proc.wait(timeout=30) == 0
    workers.procs.clear()
    assert q.counts("default").reserved == 0, "handed back at once, not left to lapse"
    ran_before = set(ledger(path))
    assert 20 in ran_before and len(ran_before) <= 60 - handed_back
    workers.start(1)
    wait_until(lambda: len(set(ledger(path))) == 60, timeout=30, interval=0.1, message="every job to run")
    workers.stop_all()
    runs = Counter(ledger(path))
    assert set(runs) == set(range(60)) and max(runs.values()) == 1
    assert {int(line.split()[1]) for line in path.read_text().splitlines()} == {1}, "every run was attempt 1"
    assert q.failed_count() == 0 and q.failed_jobs() == []
