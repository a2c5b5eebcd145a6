"""Chains and batches across real worker processes on real servers: Redis
(RedisQueue + RedisLockStore) and PostgreSQL (DatabaseQueue + its lock store).
Workers run in subprocesses (tests/contract/workflow_worker.py), are killed
with SIGKILL mid-work, and record what they did in per-process ledger files
(workflow_jobs.py)."""

from __future__ import annotations

import json
import os
import random
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

from rainier_sync import QueueManager
from rainier_sync.batch import CANCEL_LOOKUP
from tests.contract import workflow_jobs
from tests.contract.workflow_worker import connect
from tests.support import wait_until

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: Time from a worker's batch-cancel check to the start its job records (a
#: thread switch or two, more on a busy machine).
RECORDING_SLACK = 0.3


@dataclass
class Backend:
    """One real server, keys or a queue no other test uses, and a manager on them."""

    kind: str
    url: str
    prefix: str
    manager: QueueManager
    ledger: Path
    #: Short, so that a killed worker's jobs come back soon.
    reservation: float = 1.0

    def size(self) -> int:
        return int(self.manager.connection(self.kind).size(workflow_jobs.QUEUE))


def make_backend(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Iterator[Backend]:
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
    manager = QueueManager({kind: driver}, locks=locks, registry=workflow_jobs.registry())
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    yield Backend(kind, url, prefix, manager, ledger)
    manager.close()
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture(params=["postgres", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request, tmp_path, request.param)


@pytest.fixture
def redis_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from make_backend(request, tmp_path, "redis")


class Workers:
    """Worker subprocesses of one test; whatever is still running at the end is killed."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[str]] = []

    def start(self, backend: Backend, concurrency: int) -> subprocess.Popen[str]:
        b = backend
        args = [b.kind, b.url, b.prefix, str(concurrency), str(b.reservation)]
        stderr = open(self.logs / f"worker-{len(self.started)}.err", "w", encoding="utf-8")  # noqa: SIM115
        with stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.contract.workflow_worker", *args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.started.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[str]) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)

    def stop(self, proc: subprocess.Popen[str]) -> dict[str, Any]:
        """SIGTERM ``proc`` once it has its handlers (a worker still starting would
        die of the signal) and wait (bounded) for it to end; its stats."""
        index = self.started.index(proc)
        err = self.logs / f"worker-{index}.err"
        wait_until(lambda: "ready" in err.read_text(encoding="utf-8"), 30.0, 0.02, f"worker {index} to be ready")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        errors = err.read_text(encoding="utf-8")
        assert proc.returncode == 0, f"worker {index} exited {proc.returncode}:\n{out}\n{errors}"
        stats: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return stats

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    made = Workers(tmp_path)
    yield made
    made.close()


def ledger_lines(ledger: Path) -> list[list[str]]:
    """Every complete line of every process's ledger file, split on spaces (a
    process killed mid-write may leave a last line without its newline)."""
    lines: list[list[str]] = []
    for path in sorted(ledger.glob("*.log")):
        text = path.read_text(encoding="utf-8")
        lines.extend(line.split() for line in text.splitlines(keepends=True) if line.endswith("\n"))
    return lines


def callbacks(ledger: Path) -> list[str]:
    return sorted(line[1] for line in ledger_lines(ledger) if line[0] == "callback")


# -- chains -------------------------------------------------------------------------------------------------


def test_a_chain_survives_its_worker_killed_again_and_again(
    redis_backend: Backend, workers: Workers, tmp_path: Path
) -> None:
    backend, steps, kills, hold = redis_backend, 20, 8, 0.1
    ledger = str(backend.ledger)
    rng = random.Random()
    backend.manager.chain([workflow_jobs.Step(ledger, n, hold) for n in range(steps)]).dispatch()

    def fresh_begins() -> int:
        """Runs begun on a job's first attempt: the kills wait for one, so that no
        job is killed on every try it has."""
        return sum(1 for line in ledger_lines(backend.ledger) if line[0] == "begin" and line[5] == "1")

    def ended_steps() -> set[int]:
        return {int(line[1]) for line in ledger_lines(backend.ledger) if line[0] == "end"}

    # When a worker is SIGKILLed at a random moment after each new link starts, and replaced
    killed = 0
    started = time.monotonic()
    while killed < kills and time.monotonic() - started < 14.0 and steps - 1 not in ended_steps():
        seen = fresh_begins()
        proc = workers.start(backend, concurrency=2)
        wait_until(lambda: fresh_begins() > seen or steps - 1 in ended_steps(), 10.0, 0.01, "a link to start")  # noqa: B023
        time.sleep(rng.uniform(0.0, 3 * hold))
        workers.kill(proc)
        killed += 1
    last = workers.start(backend, concurrency=2)
    wait_until(lambda: steps - 1 in ended_steps(), 10.0, 0.02, "the chain's last link")
    wait_until(lambda: backend.size() == 0, 10.0, 0.02, "the queue to empty (copies of a link skipped)")
    workers.stop(last)
    assert killed >= 6, f"the chain ended after {killed} kills"

    # Then every link ran ...
    lines = ledger_lines(backend.ledger)
    assert ended_steps() == set(range(steps))

    # ... a step only after the step before it had finished once ...
    def first(what: str, n: int) -> float:
        return min(float(line[4]) for line in lines if line[0] == what and int(line[1]) == n)

    for n in range(1, steps):
        assert first("begin", n) >= first("end", n - 1), f"step {n} started before step {n - 1} had finished"
    # ... and no step ran as two jobs (one job may run again after a kill: at least once)
    for n in range(steps):
        ids = {line[3] for line in lines if line[0] == "begin" and int(line[1]) == n}
        assert len(ids) == 1, f"step {n} ran as {len(ids)} jobs: {ids}"


# -- batches ------------------------------------------------------------------------------------------------


def dispatch_batch(backend: Backend, jobs: list[Any], name: str) -> Any:
    ledger = str(backend.ledger)
    return (
        backend.manager.batch(jobs, name=name)
        .then(workflow_jobs.Callback(ledger, "then"))
        .finally_(workflow_jobs.Callback(ledger, "finally"))
        .dispatch()
    )


def test_a_batch_drained_by_two_processes_counts_exactly_through_a_kill(backend: Backend, workers: Workers) -> None:
    total = 3000
    ledger = str(backend.ledger)
    # Given a batch of no-op jobs, drained by two worker processes of 8 threads
    batch = dispatch_batch(backend, [workflow_jobs.Noop(ledger) for _ in range(total)], "drain")
    assert batch.total == total
    procs = [workers.start(backend, concurrency=8) for _ in range(2)]

    def ran() -> int:
        return sum(1 for line in ledger_lines(backend.ledger) if line[0] == "job")

    # When one is SIGKILLed mid-drain, and replaced
    wait_until(lambda: ran() >= total // 3, 30.0, 0.01, "a third of the batch to run")
    workers.kill(procs[0])
    assert ran() < total, "the batch had drained before the kill"
    procs[0] = workers.start(backend, concurrency=8)
    wait_until(lambda: len(callbacks(backend.ledger)) >= 2, 40.0, 0.05, "the batch's callbacks")
    # what the killed worker held comes back once its reservation lapses: a job it
    # had run and counted but not acknowledged runs again (and is not counted again)
    wait_until(lambda: backend.size() == 0, 10.0, 0.02, "the queue to empty")
    time.sleep(0.3)  # a callback queued twice would run within this
    for proc in procs:
        workers.stop(proc)

    # Then every job ran (some again after the kill), each counted once, and each callback ran once.
    lines = ledger_lines(backend.ledger)
    ids = [line[1] for line in lines if line[0] == "job"]
    assert len(set(ids)) == total
    done = backend.manager.find_batch(batch.id)
    assert done is not None
    assert (done.total, done.processed, done.pending, done.failed, done.skipped) == (total, total, 0, 0, 0)
    assert done.finished and not done.cancelled
    assert callbacks(backend.ledger) == ["finally", "then"]


def test_no_job_of_a_cancelled_batch_starts_once_the_cancel_is_seen(redis_backend: Backend, workers: Workers) -> None:
    backend, total = redis_backend, 2000
    ledger = str(backend.ledger)
    # Given a batch draining slowly in a worker process
    batch = dispatch_batch(backend, [workflow_jobs.Noop(ledger, hold=0.01) for _ in range(total)], "cancelled")
    proc = workers.start(backend, concurrency=4)

    def starts() -> list[float]:
        return [float(line[2]) for line in ledger_lines(backend.ledger) if line[0] == "job"]

    wait_until(lambda: len(starts()) >= 100, 20.0, 0.01, "the batch to be draining")

    # When it is cancelled from this process
    assert backend.manager.cancel_batch(batch.id)
    cancelled_at = time.time()

    # Then it finishes with every job processed or skipped, none started once the cancel was seen
    def finished() -> bool:
        found = backend.manager.find_batch(batch.id)
        return found is not None and found.finished

    wait_until(finished, 30.0, 0.05, "the cancelled batch to finish")
    wait_until(lambda: "finally" in callbacks(backend.ledger), 10.0, 0.02, "the batch's finally")
    wait_until(lambda: backend.size() == 0, 10.0, 0.02, "the queue to empty")
    time.sleep(0.3)  # a callback queued twice would run within this
    workers.stop(proc)
    done = backend.manager.find_batch(batch.id)
    assert done is not None and done.cancelled
    assert done.processed + done.skipped == done.total == total
    assert done.failed == 0 and done.pending == 0
    assert done.skipped > 0, "the cancel came too late to skip anything"
    late = [start for start in starts() if start > cancelled_at + CANCEL_LOOKUP + RECORDING_SLACK]
    assert not late, f"{len(late)} jobs started after the cancel was seen, up to {max(late) - cancelled_at:.3f}s after"
    assert len(starts()) == done.processed
    assert callbacks(backend.ledger) == ["finally"]
