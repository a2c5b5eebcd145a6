"""Chains and batches across real worker processes on real servers: Redis
(RedisQueue + RedisLockStore) and PostgreSQL (DatabaseQueue + its lock store),
each test running both backends side by side (a thread each). Workers run in
processes forked by a zygote that has imported everything
(tests/contract/workflow_worker.py) and are killed with SIGKILL mid-work: a
worker starts in milliseconds, so a kill costs what the killed worker's
reservations (0.3 s) take to lapse, not an interpreter's start-up. Each worker
records what it ran and skipped in a ledger file of its own (workflow_jobs.py).

What each test costs, both backends together (2 cores, load average 6): the
chain 10 to 15 s (20 kills; a kill mid-link waits out that link's
reservation), the drained batch about 4 s (5,000 jobs, two kills, 1 to 3% of
the jobs run again), the cancelled batch about 3 s.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rainier_sync import QueueManager
from rainier_sync.batch import CANCEL_LOOKUP
from tests.contract import workflow_jobs
from tests.contract.workflow_worker import connect
from tests.support import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
#: Time from a worker's batch-cancel check to the start its job records (a
#: thread switch or two, more on a busy machine).
RECORDING_SLACK = 0.3
#: Short, so that what a killed worker held comes back soon.
RESERVATION = 0.3


@dataclass
class Backend:
    """One real server, keys or a schema no other test uses, and a manager on them."""

    kind: str
    url: str
    prefix: str
    manager: QueueManager
    ledger: Path

    def size(self) -> int:
        return int(self.manager.connection(self.kind).size(workflow_jobs.QUEUE))

    def lines(self) -> list[list[str]]:
        """Every complete line of every process's ledger file, split on spaces (a
        process killed mid-write may leave a last line without its newline)."""
        lines: list[list[str]] = []
        for path in sorted(self.ledger.glob("*.log")):
            text = path.read_text(encoding="utf-8")
            lines.extend(line.split() for line in text.splitlines(keepends=True) if line.endswith("\n"))
        return lines

    def callbacks(self) -> list[str]:
        return sorted(line[1] for line in self.lines() if line[0] == "callback")


@pytest.fixture
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Backend]]:
    from tests.drivers.database.support import postgres_schema_url

    made: list[Backend] = []
    redis_url = request.getfixturevalue("redis_url")
    for kind, url in (("redis", redis_url), ("postgres", postgres_schema_url(request))):
        prefix = f"rstest:{uuid.uuid4().hex[:12]}:"
        driver, locks = connect(kind, url, prefix, RESERVATION)
        if kind == "postgres":
            locks.migrate()
        manager = QueueManager({kind: driver}, locks=locks, registry=workflow_jobs.registry())
        ledger = tmp_path / kind
        ledger.mkdir()
        made.append(Backend(kind, url, prefix, manager, ledger))
    assert all(backend.size() == 0 for backend in made), "an earlier test left jobs behind"
    yield made
    for backend in made:
        backend.manager.close()
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=made[0].prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def side_by_side(backends: list[Backend], scenario: Callable[[Backend], Any]) -> dict[str, Any]:
    """Run ``scenario`` for every backend at once, a thread each; what each returned."""
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def run(backend: Backend) -> None:
        try:
            results[backend.kind] = scenario(backend)
        except BaseException as exc:  # noqa: BLE001 - raised below, naming its backend
            errors[backend.kind] = exc

    threads = [threading.Thread(target=run, args=(backend,), name=backend.kind) for backend in backends]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    for kind, exc in errors.items():
        raise AssertionError(f"on {kind}: {exc}") from exc
    assert len(results) == len(backends), "a scenario did not finish in time"
    return results


class Workers:
    """Worker processes of one test, forked by a zygote per backend (it has imported
    everything, so a worker starts in milliseconds); whatever is still running at
    the end is killed."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.zygotes: dict[str, subprocess.Popen[str]] = {}
        self.errs: dict[int, Path] = {}
        self.ledgers: dict[int, Path] = {}
        self.lock = threading.Lock()

    def _zygote(self, backend: Backend, concurrency: int) -> subprocess.Popen[str]:
        key = f"{backend.kind}-{concurrency}"
        zygote = self.zygotes.get(key)
        if zygote is None:
            b = backend
            args = [b.kind, b.url, b.prefix, str(concurrency), str(RESERVATION), str(b.ledger)]
            with open(self.logs / f"{key}.err", "w", encoding="utf-8") as stderr:
                zygote = subprocess.Popen(
                    [sys.executable, "-m", "tests.contract.workflow_worker", "zygote", *args],
                    cwd=ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            self.zygotes[key] = zygote
        return zygote

    def start(self, backend: Backend, concurrency: int) -> int:
        """A new worker on ``backend``, working as soon as it has connected; its pid."""
        with self.lock:
            zygote = self._zygote(backend, concurrency)
            assert zygote.stdin is not None and zygote.stdout is not None
            zygote.stdin.write("fork\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            self.errs[pid] = self.logs / f"{backend.kind}-{concurrency}.err"
            self.ledgers[pid] = backend.ledger
        return pid

    def ready(self, pid: int) -> None:
        """Wait (bounded) until the worker is connected and has its signal handlers."""
        err = self.errs[pid]
        said = f"ready {pid}\n"
        wait_until(lambda: said in err.read_text(encoding="utf-8"), 60.0, 0.005, f"worker {pid} to be ready")

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def stop(self, pid: int) -> dict[str, Any]:
        """SIGTERM the worker once it has its handlers (a worker still starting would
        die of the signal) and wait (bounded) for the stats it writes as it ends."""
        self.ready(pid)
        os.kill(pid, signal.SIGTERM)
        stats = self.ledgers[pid] / f"stats-{pid}.json"
        err = self.errs[pid]
        wait_until(stats.exists, 30.0, 0.02, f"worker {pid} to stop ({err.read_text(encoding='utf-8')[-2000:]})")
        found: dict[str, Any] = json.loads(stats.read_text(encoding="utf-8"))
        return found

    def close(self) -> None:
        for pid, ledger in self.ledgers.items():
            if not (ledger / f"stats-{pid}.json").exists():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for zygote in self.zygotes.values():
            assert zygote.stdin is not None and zygote.stdout is not None
            zygote.stdin.close()  # it reaps its workers, then ends
            try:
                zygote.wait(timeout=15)
            except subprocess.TimeoutExpired:
                zygote.kill()
                zygote.wait(timeout=5)
            zygote.stdout.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    made = Workers(tmp_path)
    yield made
    made.close()


# -- chains -------------------------------------------------------------------------------------------------


def chain_through_kills(backend: Backend, workers: Workers, steps: int = 20, kills: int = 20) -> int:
    """A chain of ``steps`` links, its worker killed ``kills`` times, each at a random
    moment from just after a link began to well after it ended (mid-link, between
    its end and the hand-over, between the hand-over and the acknowledgement, after)."""
    hold = 0.08
    rng = random.Random()
    backend.manager.chain([workflow_jobs.Step(str(backend.ledger), n, hold) for n in range(steps)]).dispatch()

    def ended() -> set[int]:
        return {int(line[1]) for line in backend.lines() if line[0] == "end"}

    def begun_by(pid: int) -> bool:
        return any(line[0] == "begin" and line[2] == str(pid) for line in backend.lines())

    killed = 0
    while killed < kills and steps - 1 not in ended():
        pid = workers.start(backend, 2)
        wait_until(lambda: begun_by(pid) or steps - 1 in ended(), 30.0, 0.005, "a link to begin")  # noqa: B023
        time.sleep(rng.uniform(0.0, 1.5 * hold))
        workers.kill(pid)
        killed += 1
    last = workers.start(backend, 2)
    wait_until(lambda: steps - 1 in ended(), 60.0, 0.02, "the chain's last link")
    wait_until(lambda: backend.size() == 0, 20.0, 0.02, "the queue to empty")
    workers.stop(last)
    return killed


def test_a_chain_survives_its_worker_killed_at_random_points_twenty_times(
    backends: list[Backend], workers: Workers
) -> None:
    steps, kills = 20, 20
    killed = side_by_side(backends, lambda backend: chain_through_kills(backend, workers, steps, kills))
    for backend in backends:
        assert killed[backend.kind] == kills, f"{backend.kind}: the chain ended after {killed[backend.kind]} kills"
        lines = backend.lines()
        # Then every link ran ...
        assert {int(line[1]) for line in lines if line[0] == "end"} == set(range(steps)), backend.kind

        # ... a link only after the link before it had ended once ...
        def first(what: str, n: int, lines: list[list[str]] = lines) -> float:
            return min(float(line[4]) for line in lines if line[0] == what and int(line[1]) == n)

        for n in range(1, steps):
            assert first("begin", n) >= first("end", n - 1), f"{backend.kind}: step {n} began before step {n - 1}"
        # ... and no link ran as two jobs (one job may run again after a kill: at least once)
        for n in range(steps):
            ids = {line[3] for line in lines if line[0] == "begin" and int(line[1]) == n}
            assert len(ids) == 1, f"{backend.kind}: step {n} ran as {len(ids)} jobs: {ids}"
        skipped = [line for line in lines if line[0] == "skip"]
        if backend.kind == "postgres":
            # the next link is stored by the transaction that acknowledges the link: never a second copy
            assert skipped == [], f"postgres: copies of links were dispatched and skipped: {skipped}"


# -- batches ------------------------------------------------------------------------------------------------


def dispatch_batch(backend: Backend, jobs: list[Any], name: str) -> Any:
    ledger = str(backend.ledger)
    return (
        backend.manager.batch(jobs, name=name)
        .then(workflow_jobs.Callback(ledger, "then"))
        .finally_(workflow_jobs.Callback(ledger, "finally"))
        .dispatch()
    )


def drain_through_kills(backend: Backend, workers: Workers, total: int) -> int:
    """A batch drained by two workers of 8 threads, each killed once at a random
    point of the drain and replaced; how many jobs ran more than once."""
    ledger = str(backend.ledger)
    # Each job holds 2 ms after it records its start, so a kill while a worker runs
    # jobs always finds some begun and unsettled: they run again, whatever the load.
    batch = dispatch_batch(backend, [workflow_jobs.Noop(ledger, hold=0.002) for _ in range(total)], "drain")
    assert batch.total == total
    running = [workers.start(backend, 8) for _ in range(2)]

    def ran_by(pid: int) -> int:
        path = backend.ledger / f"{pid}.log"
        return path.read_bytes().count(b"\n") if path.exists() else 0

    def ran() -> int:  # runs, not jobs: a job run again counts twice (cheap to read often)
        return sum(path.read_bytes().count(b"\n") for path in backend.ledger.glob("*.log"))

    rng = random.Random()
    killed = 0
    for index, (low, high) in enumerate(((0.15, 0.35), (0.5, 0.7))):
        at = int(total * rng.uniform(low, high))
        wait_until(lambda: ran() >= at, 60.0, 0.005, f"{at} jobs to run")  # noqa: B023
        # Killed while it runs jobs, not while it waits for some: unless the drain is
        # about over (the other worker took what was left), when this kill is let go.
        busy = ran_by(running[index]) + 8
        wait_until(
            lambda: ran_by(running[index]) >= busy or ran() >= total - 300,  # noqa: B023
            30.0, 0.001, "the worker to be running jobs",
        )  # fmt: skip
        if ran_by(running[index]) < busy:
            assert index > 0, "the first kill comes early in the drain"
            continue
        workers.kill(running[index])
        killed += 1
        running[index] = workers.start(backend, 8)
    assert killed >= 1
    wait_until(lambda: len(backend.callbacks()) >= 2, 60.0, 0.05, "the batch's callbacks")
    # what a killed worker held comes back once its reservation lapses: a job it
    # had run and counted but not acknowledged runs again (and is not counted again)
    wait_until(lambda: backend.size() == 0, 20.0, 0.02, "the queue to empty")
    time.sleep(0.3)  # a callback queued twice would run (or be skipped) within this
    for pid in running:
        workers.stop(pid)
    done = backend.manager.find_batch(batch.id)
    assert done is not None
    assert (done.total, done.processed, done.pending, done.failed, done.skipped) == (total, total, 0, 0, 0)
    assert done.finished and not done.cancelled
    runs = collections.Counter(line[1] for line in backend.lines() if line[0] == "job")
    assert len(runs) == total, "every job ran"
    return sum(1 for n in runs.values() if n > 1)


def test_a_batch_drained_by_two_processes_counts_exactly_through_kills(
    backends: list[Backend], workers: Workers
) -> None:
    total = 5000
    again = side_by_side(backends, lambda backend: drain_through_kills(backend, workers, total))
    for backend in backends:
        # about 1% of the jobs ran twice: the kills caught them begun, or run and counted, unacknowledged
        print(f"{backend.kind}: {again[backend.kind]} of {total} jobs ran again after the kills")
        assert again[backend.kind] > 0, f"{backend.kind}: no job ran again after the kills"
        assert backend.callbacks() == ["finally", "then"], f"{backend.kind}: each callback once"


def cancel_mid_drain(backend: Backend, workers: Workers, total: int) -> float:
    """A batch draining slowly in a worker process, cancelled from here; when."""
    ledger = str(backend.ledger)
    batch = dispatch_batch(backend, [workflow_jobs.Noop(ledger, hold=0.01) for _ in range(total)], "cancelled")
    pid = workers.start(backend, 4)

    def starts() -> list[float]:
        return [float(line[2]) for line in backend.lines() if line[0] == "job"]

    wait_until(lambda: len(starts()) >= 100, 30.0, 0.01, "the batch to be draining")
    assert backend.manager.cancel_batch(batch.id)
    cancelled_at = time.time()

    def finished() -> bool:
        found = backend.manager.find_batch(batch.id)
        return found is not None and found.finished

    wait_until(finished, 30.0, 0.05, "the cancelled batch to finish")
    wait_until(lambda: "finally" in backend.callbacks(), 10.0, 0.02, "the batch's finally")
    wait_until(lambda: backend.size() == 0, 10.0, 0.02, "the queue to empty")
    time.sleep(0.3)  # a callback queued twice would run (or be skipped) within this
    workers.stop(pid)
    done = backend.manager.find_batch(batch.id)
    assert done is not None and done.cancelled
    assert done.processed + done.skipped == done.total == total
    assert done.failed == 0 and done.pending == 0
    assert done.skipped > 0, "the cancel came too late to skip anything"
    late = [start for start in starts() if start > cancelled_at + CANCEL_LOOKUP + RECORDING_SLACK]
    assert not late, f"{len(late)} jobs started after the cancel was seen, up to {max(late) - cancelled_at:.3f}s after"
    assert len(starts()) == done.processed
    return cancelled_at


def test_no_job_of_a_cancelled_batch_starts_once_the_cancel_is_seen(backends: list[Backend], workers: Workers) -> None:
    side_by_side(backends, lambda backend: cancel_mid_drain(backend, workers, 2000))
    for backend in backends:
        assert backend.callbacks() == ["finally"], f"{backend.kind}: finally once, no then"
