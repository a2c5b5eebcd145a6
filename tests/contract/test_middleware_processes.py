"""Job middleware and paused queues across real worker processes on real
servers: PostgreSQL (DatabaseQueue + DatabaseLockStore) and Redis (RedisQueue +
RedisLockStore); pausing on SQS (moto) and Kafka (tansu) too, through a lock
store on Redis. Workers run in subprocesses (tests/contract/middleware_worker.py)
and record what they did in per-process ledger files (middleware_jobs.py);
the backends come from tests/contract/processes.py."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract import middleware_jobs
from tests.contract.processes import Backend, Workers, open_backend
from tests.support import wait_until

pytestmark = [pytest.mark.slow]

WORKER = "tests.contract.middleware_worker"


@pytest.fixture(params=["postgres", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with open_backend(request, tmp_path, request.param, middleware_jobs.registry()) as made:
        yield made


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    made = Workers(WORKER, tmp_path)
    yield made
    made.close()


def start(workers: Workers, backend: Backend, mode: str, concurrency: int = 4, sleep: float = 0.2) -> Any:
    """A worker process (each notes ``ready-<pid>`` in the ledger directory as it starts to claim)."""
    return workers.start(backend, mode, str(concurrency), str(sleep), str(backend.ledger))


def ledger_lines(ledger: Path) -> list[list[str]]:
    """Every complete line of every process's ledger file, split on spaces."""
    lines: list[list[str]] = []
    for path in sorted(ledger.glob("*.log")):
        text = path.read_text(encoding="utf-8")
        lines.extend(line.split() for line in text.splitlines(keepends=True) if line.endswith("\n"))
    return lines


def most_surely_in_a_window(spans: list[tuple[float, float]], width: float) -> int:
    """The most ``(before, after)`` spans that lie wholly inside one half-open
    window ``[t, t + width)``: each span holds the moment its start was granted,
    so that many grants surely fell in one window (a start recorded late, by a
    process kept off the CPU, can only make this count smaller)."""
    spans = sorted(spans)
    most = 0
    for first, (begin, _) in enumerate(spans):
        inside = 0
        for before, after in spans[first:]:
            if before >= begin + width:
                break
            inside += after < begin + width
        most = max(most, inside)
    return most


def test_the_window_helpers_count_what_a_window_holds() -> None:
    assert most_surely_in_a_window([(0.0, 0.0), (0.5, 0.6), (0.9, 0.99), (1.0, 1.0)], 1.0) == 3
    assert most_surely_in_a_window([(0.0, 0.0), (0.5, 1.2), (0.9, 0.99)], 1.0) == 2, "a span past the window"
    assert most_surely_in_a_window([(0.0, 0.1), (1.0, 1.1), (2.0, 2.1)], 1.0) == 1
    assert most_surely_in_a_window([], 1.0) == 0


def drain_under_a_limit(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Workers, total: int, limit: int, per: float = 1.0
) -> None:
    """``total`` jobs under ``RateLimited(limit, per)`` drained by two resident
    worker processes of 8 threads on PostgreSQL and two on Redis, all four at
    once; checks the ledger of their starts."""
    with contextlib.ExitStack() as stack:
        backends = [
            stack.enter_context(open_backend(request, tmp_path, kind, middleware_jobs.registry()))
            for kind in ("postgres", "redis")
        ]
        # Given the jobs on each backend, limited, drained by two resident workers each
        for backend in backends:
            limiter = f"api-{uuid.uuid4().hex[:8]}"
            backend.dispatch(
                [middleware_jobs.Limited(str(backend.ledger), n, limiter, limit, per) for n in range(total)]
            )
        procs = {b.kind: [start(workers, b, "forever", concurrency=8, sleep=0.1) for _ in range(2)] for b in backends}
        for backend in backends:
            wait_until(lambda: len(ledger_lines(backend.ledger)) >= total, 150.0, 0.2, f"{backend.kind}: every job")  # noqa: B023
        stats = {kind: [workers.stop(proc) for proc in started] for kind, started in procs.items()}

        for backend in backends:
            # Then every job ran exactly once, on its first attempt (a deferral spends no try) ...
            done, lines = stats[backend.kind], ledger_lines(backend.ledger)
            assert sorted(int(n) for n, _, _, _ in lines) == list(range(total)), backend.kind
            assert {attempt for _, _, _, attempt in lines} == {"1"}, backend.kind
            assert backend.size() == 0
            assert sum(s["processed"] for s in done) == total
            assert sum(s["failed"] + s["released"] for s in done) == 0
            # (a job first looked at in a later window may start without a deferral)
            assert sum(s["deferred"] for s in done) > 0, "the limit was never met"
            assert all(s["processed"] > 0 for s in done), f"one worker did everything: {done}"

            # ... and no window of `per` seconds, across both processes, held more than `limit` starts.
            spans = [(float(before), float(after)) for _, before, after, _ in lines]
            assert most_surely_in_a_window(spans, per) <= limit, backend.kind
            assert max(a for _, a in spans) - min(b for b, _ in spans) >= (total // limit - 1) * per


def test_a_rate_limit_holds_across_two_worker_processes_on_postgres_and_redis(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Workers
) -> None:
    """2,000 jobs under ``RateLimited(limit=50, per=1)`` take 40 s to drain on
    each backend, so the two backends run side by side (four worker processes
    at once). A limit this near the load is taken one start at a time."""
    drain_under_a_limit(request, tmp_path, workers, total=2000, limit=50)


def test_starts_taken_several_at_a_time_hold_the_limit_across_worker_processes(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Workers
) -> None:
    """A limit of 500 a second lets a worker take up to 10 starts at once (what
    the whole limit allows in 20 ms), and eight threads of no-op jobs keep it
    full: the ledger shows no window over the limit all the same."""
    drain_under_a_limit(request, tmp_path, workers, total=3000, limit=500)


def test_without_overlapping_holds_across_two_worker_processes(backend: Backend, workers: Workers) -> None:
    # Given two resident workers of 4 threads, both up, and then 200 jobs over 10 keys,
    # the keys in turn, so that both processes' claims hold jobs of every key
    total, keys = 200, 10
    procs = [start(workers, backend, "forever", concurrency=4) for _ in range(2)]
    wait_until(lambda: len(list(backend.ledger.glob("ready-*"))) == 2, 30.0, 0.02, "both workers up")
    backend.dispatch(
        [
            middleware_jobs.Exclusive(str(backend.ledger), n, f"key-{n % keys}", hold=0.02)
            for n in range(total)
        ]
    )
    wait_until(lambda: len(ledger_lines(backend.ledger)) >= total, 60.0, 0.05, "every job")
    stats = [workers.stop(proc) for proc in procs]

    # Then every job ran once, on its first attempt, and no two of one key overlapped.
    lines = ledger_lines(backend.ledger)
    assert sorted(int(line[0]) for line in lines) == list(range(total))
    assert {line[4] for line in lines} == {"1"}
    assert sum(s["processed"] for s in stats) == total
    assert sum(s["deferred"] for s in stats) > 0, "no job ever met its key held"
    assert len({line[5] for line in lines}) == 2, "both processes ran jobs"
    by_key: dict[str, list[tuple[float, float]]] = {}
    for line in lines:
        by_key.setdefault(line[1], []).append((float(line[2]), float(line[3])))
    assert len(by_key) == keys
    for key, spans in by_key.items():
        spans.sort()
        for (_, end), (began, _) in zip(spans, spans[1:], strict=False):
            assert began >= end, f"two jobs of {key} overlapped: one ended at {end}, the next started at {began}"


def test_a_killed_holder_lock_lapses_after_expire_after(backend: Backend, workers: Workers) -> None:
    expire_after = 2.0
    ledger = str(backend.ledger)
    backend.reservation = 1.0

    def exclusive(n: int, hang: bool = False) -> middleware_jobs.Exclusive:
        return middleware_jobs.Exclusive(ledger, n, "stuck", expire_after=expire_after, hang=hang)

    # Given a worker process holding key "stuck" in a job that hangs
    holder = start(workers, backend, "forever", concurrency=2)
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
    other = start(workers, backend, "forever", concurrency=4)

    # Then they all run (the killed job too, on a later attempt), none before the lock lapsed
    def done() -> list[list[str]]:
        return [line for line in ledger_lines(backend.ledger) if line[0] != "hanging"]

    wait_until(lambda: len(done()) == 6, 20.0, 0.05, "every job of the key after the holder died")
    workers.stop(other)
    runs = done()
    assert sorted(int(line[0]) for line in runs) == list(range(6))
    assert next(int(line[4]) for line in runs if line[0] == "0") >= 2, "the killed job runs again"
    spans = sorted((float(line[2]), float(line[3])) for line in runs)
    assert spans[0][0] >= taken + expire_after, "a job ran while the dead holder's lock lived"
    for (_, end), (began, _) in zip(spans, spans[1:], strict=False):
        assert began >= end
    assert backend.size() == 0


@pytest.mark.parametrize("kind", ["postgres", "redis", "sqs", "kafka"])
def test_a_paused_queue_is_not_claimed_by_a_worker_in_another_process(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Workers, kind: str
) -> None:
    """On SQS and Kafka the pause is a flag in the manager's lock store (here on
    Redis), as on the others. An SQS worker's long poll (1 s here) that began
    before the pause still receives until it ends; the wait before dispatching
    outlasts it."""
    sleep, total = 0.2, 20
    with open_backend(request, tmp_path, kind, middleware_jobs.registry(), reservation=5.0) as backend:
        ledger = str(backend.ledger)
        # Given a resident worker that has run a first job
        worker = start(workers, backend, "forever", concurrency=2, sleep=sleep)
        backend.dispatch([middleware_jobs.Plain(ledger, -1)])
        wait_until(lambda: len(ledger_lines(backend.ledger)) == 1, 30.0, 0.02, "the worker's first job")

        # When this process pauses its queue: the worker stops claiming within `sleep`
        backend.manager.pause(backend.queue, connection=backend.kind)
        assert backend.manager.paused(connection=backend.kind) == {backend.queue}
        # The guarantee is a time: "within sleep"; past it, the worker must have seen the pause
        time.sleep(3 * sleep if kind != "sqs" else 1.0 + 3 * sleep)
        paused_at = time.time()
        backend.dispatch([middleware_jobs.Plain(ledger, n) for n in range(total)])

        # Then dispatch is accepted, and nothing runs for a while (many `sleep`s)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert len(ledger_lines(backend.ledger)) == 1, "a job ran on a paused queue"
            time.sleep(0.05)
        if kind != "kafka":  # a partition's lag is read lazily: counted below, once all ran
            assert backend.size() == total

        # And once resumed, every job runs
        backend.manager.resume(backend.queue, connection=backend.kind)
        assert backend.manager.paused(connection=backend.kind) == set()
        wait_until(lambda: len(ledger_lines(backend.ledger)) == total + 1, 30.0, 0.02, "every job after resume")
        stats = workers.stop(worker)
        lines = ledger_lines(backend.ledger)
        assert sorted(int(n) for n, _ in lines) == list(range(-1, total))
        assert min(float(began) for n, began in lines if n != "-1") > paused_at + 1.5
        assert stats["processed"] == total + 1
