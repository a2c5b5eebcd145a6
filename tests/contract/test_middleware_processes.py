"""Job middleware and paused queues across real worker processes on real
servers: PostgreSQL (DatabaseQueue + DatabaseLockStore) and Redis (RedisQueue +
RedisLockStore). Workers run in subprocesses (tests/contract/middleware_worker.py)
and record what they did in per-process ledger files (middleware_jobs.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rainier_sync import Job, QueueManager
from tests.contract import middleware_jobs
from tests.contract.middleware_worker import connect
from tests.support import wait_until

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: Time from a job's limiter check to the start it records (a thread switch or
#: two); the windows checked over recorded starts are shorter by this much.
RECORDING_SLACK = 0.1


@dataclass
class Backend:
    """One real server, a queue no other test uses, and a manager on them."""

    kind: str
    url: str
    prefix: str
    queue: str
    manager: QueueManager
    ledger: Path
    #: Long enough that no heartbeat missed under load lets a job run twice;
    #: the kill test shortens it so that the killed worker's jobs come back soon.
    reservation: float = 30.0

    def dispatch(self, jobs: list[Job]) -> None:
        built = [self.manager.build(job, queue=self.queue, connection=self.kind) for job in jobs]
        for start in range(0, len(built), 200):
            self.manager.send_queued(self.kind, built[start : start + 200])

    def size(self) -> int:
        return int(self.manager.connection(self.kind).size(self.queue))


@pytest.fixture(params=["postgres", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    prefix = f"rstest:{uuid.uuid4().hex[:12]}:"
    if kind == "redis":
        request.applymarker(pytest.mark.redis)
        url = request.getfixturevalue("redis_url")
    else:
        from tests.drivers.database.support import postgres_schema_url

        request.applymarker(pytest.mark.postgres)
        url = postgres_schema_url(request)
    driver, locks = connect(kind, url, prefix, 1.0)
    if kind == "postgres":
        locks.migrate()
    manager = QueueManager({kind: driver}, locks=locks, registry=middleware_jobs.registry())
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    yield Backend(kind, url, prefix, f"mw-{uuid.uuid4().hex[:10]}", manager, ledger)
    manager.close()
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


class Workers:
    """Worker subprocesses of one test; whatever is still running at the end is killed."""

    def __init__(self, backend: Backend, logs: Path) -> None:
        self.backend = backend
        self.logs = logs
        self.started: list[subprocess.Popen[str]] = []

    def start(self, mode: str, concurrency: int = 4, sleep: float = 0.2) -> subprocess.Popen[str]:
        b = self.backend
        args = [b.kind, b.url, b.prefix, b.queue, mode, str(concurrency), str(sleep), str(b.reservation)]
        stderr = open(self.logs / f"worker-{len(self.started)}.err", "w", encoding="utf-8")  # noqa: SIM115
        with stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.contract.middleware_worker", *args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.started.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
        """Wait for ``proc`` to end on its own (bounded); its stats."""
        out, _ = proc.communicate(timeout=timeout)
        index = self.started.index(proc)
        errors = (self.logs / f"worker-{index}.err").read_text(encoding="utf-8")
        assert proc.returncode == 0, f"worker {index} exited {proc.returncode}:\n{out}\n{errors}"
        stats: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return stats

    def stop(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        proc.send_signal(signal.SIGTERM)
        return self.finish(proc, timeout=30.0)

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


@pytest.fixture
def workers(backend: Backend, tmp_path: Path) -> Iterator[Workers]:
    made = Workers(backend, tmp_path)
    yield made
    made.close()


def ledger_lines(ledger: Path) -> list[list[str]]:
    """Every complete line of every process's ledger file, split on spaces."""
    lines: list[list[str]] = []
    for path in sorted(ledger.glob("*.log")):
        text = path.read_text(encoding="utf-8")
        lines.extend(line.split() for line in text.splitlines(keepends=True) if line.endswith("\n"))
    return lines


def most_in_a_window(starts: list[float], width: float) -> int:
    """The most ``starts`` that any half-open window ``[t, t + width)`` holds."""
    starts = sorted(starts)
    most, first = 0, 0
    for last, start in enumerate(starts):
        while starts[first] <= start - width:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_the_window_helper_counts_what_a_window_holds() -> None:
    assert most_in_a_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3
    assert most_in_a_window([0.0, 1.0, 2.0], 1.0) == 1
    assert most_in_a_window([], 1.0) == 0


def test_a_rate_limit_holds_across_two_worker_processes(backend: Backend, workers: Workers) -> None:
    # Given 500 jobs limited to 100 starts a second, drained by two --once workers
    total, limit, per = 500, 100, 1.0
    limiter = f"api-{uuid.uuid4().hex[:8]}"
    backend.dispatch([middleware_jobs.Limited(str(backend.ledger), n, limiter, limit, per) for n in range(total)])
    procs = [workers.start("once", concurrency=4) for _ in range(2)]
    stats = [workers.finish(proc) for proc in procs]

    # Then every job ran exactly once, on its first attempt (a deferral spends no try) ...
    lines = ledger_lines(backend.ledger)
    assert sorted(int(n) for n, _, _ in lines) == list(range(total))
    assert {attempt for _, _, attempt in lines} == {"1"}
    assert backend.size() == 0
    assert sum(s["processed"] for s in stats) == total
    assert sum(s["failed"] + s["released"] for s in stats) == 0
    assert sum(s["deferred"] for s in stats) >= total - limit, "the limit was never met"
    assert all(s["processed"] > 0 for s in stats), f"one worker did everything: {stats}"

    # ... and no window of `per` seconds, across both processes, held more than `limit` starts.
    starts = [float(start) for _, start, _ in lines]
    assert most_in_a_window(starts, per - RECORDING_SLACK) <= limit
    assert max(starts) - min(starts) >= (total // limit - 1) * per - RECORDING_SLACK


def test_without_overlapping_holds_across_two_worker_processes(backend: Backend, workers: Workers) -> None:
    # Given 100 jobs over 10 keys, drained by two --once workers of 4 threads; each
    # key's jobs are dispatched together, so the jobs claimed at once share keys
    total, keys = 100, 10
    backend.dispatch(
        [
            middleware_jobs.Exclusive(str(backend.ledger), n, f"key-{n // (total // keys)}", hold=0.02)
            for n in range(total)
        ]
    )
    procs = [workers.start("once", concurrency=4) for _ in range(2)]
    stats = [workers.finish(proc) for proc in procs]

    # Then every job ran once, on its first attempt, and no two of one key overlapped.
    lines = ledger_lines(backend.ledger)
    assert sorted(int(line[0]) for line in lines) == list(range(total))
    assert {line[4] for line in lines} == {"1"}
    assert sum(s["processed"] for s in stats) == total
    assert sum(s["deferred"] for s in stats) > 0, "no job ever met its key held"
    by_key: dict[str, list[tuple[float, float]]] = {}
    for _, key, start, end, _, _ in lines:
        by_key.setdefault(key, []).append((float(start), float(end)))
    assert len(by_key) == keys
    for key, spans in by_key.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"two jobs of {key} overlapped: one ended at {end}, the next started at {start}"


def test_a_killed_holder_lock_lapses_after_expire_after(backend: Backend, workers: Workers) -> None:
    expire_after = 2.0
    ledger = str(backend.ledger)
    backend.reservation = 1.0

    def exclusive(n: int, hang: bool = False) -> middleware_jobs.Exclusive:
        return middleware_jobs.Exclusive(ledger, n, "stuck", expire_after=expire_after, hang=hang)

    # Given a worker process holding key "stuck" in a job that hangs
    holder = workers.start("forever", concurrency=2)
    backend.dispatch([exclusive(0, hang=True)])
    wait_until(lambda: any(line[0] == "hanging" for line in ledger_lines(backend.ledger)), 20.0, 0.02,
               "the first job to take the lock")  # fmt: skip
    hanging = next(line for line in ledger_lines(backend.ledger) if line[0] == "hanging")
    assert int(hanging[4]) == holder.pid
    taken = float(hanging[3])

    # When more jobs of that key are queued, and the holder is killed with SIGKILL
    backend.dispatch([exclusive(n) for n in range(1, 6)])
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate(timeout=10)
    other = workers.start("forever", concurrency=4)

    # Then they all run (the killed job too, on a later attempt), none before the lock lapsed
    def done() -> list[list[str]]:
        return [line for line in ledger_lines(backend.ledger) if line[0] != "hanging"]

    wait_until(lambda: len(done()) == 6, 20.0, 0.05, "every job of the key after the holder died")
    workers.stop(other)
    runs = done()
    assert sorted(int(line[0]) for line in runs) == list(range(6))
    assert next(int(line[4]) for line in runs if line[0] == "0") >= 2, "the killed job runs again"
    spans = sorted((float(line[2]), float(line[3])) for line in runs)
    assert spans[0][0] >= taken + expire_after - RECORDING_SLACK, "a job ran while the dead holder's lock lived"
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end
    assert backend.size() == 0


def test_a_paused_queue_is_not_claimed_by_a_worker_in_another_process(backend: Backend, workers: Workers) -> None:
    sleep, total = 0.2, 20
    ledger = str(backend.ledger)
    # Given a resident worker that has run a first job
    worker = workers.start("forever", concurrency=2, sleep=sleep)
    backend.dispatch([middleware_jobs.Plain(ledger, -1)])
    wait_until(lambda: len(ledger_lines(backend.ledger)) == 1, 20.0, 0.02, "the worker's first job")

    # When this process pauses its queue: the worker stops claiming within `sleep`
    backend.manager.pause(backend.queue, connection=backend.kind)
    assert backend.manager.paused(connection=backend.kind) == {backend.queue}
    time.sleep(3 * sleep)  # the guarantee is a time: "within sleep"; past it, the worker must have seen the pause
    paused_at = time.time()
    backend.dispatch([middleware_jobs.Plain(ledger, n) for n in range(total)])

    # Then dispatch is accepted, and nothing runs for a while (many `sleep`s)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert len(ledger_lines(backend.ledger)) == 1, "a job ran on a paused queue"
        time.sleep(0.05)
    assert backend.size() == total

    # And once resumed, every job runs
    backend.manager.resume(backend.queue, connection=backend.kind)
    assert backend.manager.paused(connection=backend.kind) == set()
    wait_until(lambda: len(ledger_lines(backend.ledger)) == total + 1, 20.0, 0.02, "every job after resume")
    stats = workers.stop(worker)
    lines = ledger_lines(backend.ledger)
    assert sorted(int(n) for n, _ in lines) == list(range(-1, total))
    assert min(float(start) for n, start in lines if n != "-1") > paused_at + 1.0
    assert stats["processed"] == total + 1
