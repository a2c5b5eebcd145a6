"""Reliability on the real servers, with real worker processes: exactly once
when nobody crashes, at least once when a worker is killed or its connection
is cut, never lost."""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from rainier_sync.drivers.database import DatabaseQueue
from tests.support import wait_until

from .jobs import Count, Ledger, Stall, manager

ROOT = pathlib.Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


class Workers:
    """Worker processes started by a test, always stopped at its end."""

    def __init__(self, url: str, out: pathlib.Path) -> None:
        self.url = url
        self.out = out
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        env = dict(os.environ, RAINIER_TEST_OUT=str(self.out))
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.drivers.database.jobs", self.url, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str], timeout: float = 120) -> str:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]
        return out

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def runs(self) -> collections.Counter[int]:
        counter: collections.Counter[int] = collections.Counter()
        for path in self.out.glob("*.runs"):
            for line in path.read_text().splitlines():
                counter[int(line.split()[0])] += 1
        return counter


@pytest.fixture
def workers_for(runs_dir: pathlib.Path) -> Iterator[object]:
    made: list[Workers] = []

    def make(url: str) -> Workers:
        workers = Workers(url, runs_dir)
        made.append(workers)
        return workers

    yield make
    for workers in made:
        workers.stop_all()


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_two_worker_processes_drain_20000_jobs_exactly_once(
    dialect: str, request: pytest.FixtureRequest, workers_for: object
) -> None:
    url = request.getfixturevalue("pg_url" if dialect == "postgres" else "sqlite_url")
    m = manager(url)
    total = 20_000
    for start in range(0, total, 1000):
        m.dispatch_many([Count(n) for n in range(start, start + 1000)])
    m.close()
    workers: Workers = workers_for(url)  # type: ignore[operator]
    procs = [workers.start("--concurrency=8", "--once") for _ in range(2)]
    outputs = [workers.finish(p, timeout=240) for p in procs]
    runs = workers.runs()
    assert len(runs) == total, f"{total - len(runs)} jobs never ran ({outputs})"
    twice = {n: c for n, c in runs.items() if c != 1}
    assert not twice, f"jobs ran more than once: {list(twice.items())[:10]}"
    assert all("processed=" in o and "failed=0" in o for o in outputs), outputs
    assert sum(int(o.split("processed=")[1].split()[0]) for o in outputs) == total
    queue = DatabaseQueue.from_url(url)
    assert queue.size() == 0 and queue.failed_count() == 0
    queue.close()


@pytest.mark.parametrize("dialect", ["postgres", "sqlite"])
def test_a_job_held_by_a_killed_worker_runs_again_after_its_reservation(
    dialect: str, request: pytest.FixtureRequest, runs_dir: pathlib.Path, workers_for: object
) -> None:
    url = request.getfixturevalue("pg_url" if dialect == "postgres" else "sqlite_url")
    m = manager(url)
    m.dispatch(Stall(1))
    m.close()
    workers: Workers = workers_for(url)  # type: ignore[operator]
    doomed = workers.start("--concurrency=2", "--reservation=2")
    wait_until(lambda: (runs_dir / "started-1").exists(), timeout=30, message="the first attempt to start")
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    rescuer = workers.start("--concurrency=2", "--max-jobs=1", "--reclaim-interval=0.2", "--sleep=0.2")
    workers.finish(rescuer, timeout=60)
    lines = [line for path in runs_dir.glob("*.runs") for line in path.read_text().splitlines()]
    assert lines == ["1 2"], "the job must run to completion on its second attempt, on the other worker"
    queue = DatabaseQueue.from_url(url)
    assert queue.size() == 0 and queue.failed_count() == 0
    queue.close()


def test_a_worker_whose_connection_is_terminated_reconnects_and_finishes(pg_url: str, workers_for: object) -> None:
    import psycopg

    total = 3000
    m = manager(pg_url)
    for start in range(0, total, 1000):
        m.dispatch_many([Count(n, pause=0.002) for n in range(start, start + 1000)])
    m.close()
    workers: Workers = workers_for(pg_url)  # type: ignore[operator]
    proc = workers.start("--concurrency=8", "--once", "--reservation=5", "--application-name=rainier-cut-me")
    terminated = 0
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for threshold in (total // 4, total // 2):
            wait_until(lambda t=threshold: sum(workers.runs().values()) >= t, timeout=60, message=f"{threshold} runs")
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE %s",
                ("rainier-cut-me%",),
            ).fetchone()
            assert row is not None
            terminated += row[0]
    assert terminated >= 2
    out = workers.finish(proc, timeout=120)
    runs = workers.runs()
    # A claim whose reply was lost with the connection lapses and runs later: at
    # least once; a once worker may end before that reservation lapses, so sweep.
    if len(runs) < total:
        time.sleep(5.5)
        workers.finish(workers.start("--concurrency=8", "--once", "--reclaim-interval=0.1"), timeout=60)
        runs = workers.runs()
    assert set(runs) == set(range(total)), f"lost: {sorted(set(range(total)) - set(runs))[:10]} ({out})"
    queue = DatabaseQueue.from_url(pg_url)
    assert queue.size() == 0 and queue.failed_count() == 0
    queue.close()


def test_mariadb_workers_killed_three_times_mid_drain_lose_nothing_and_rerun_only_what_they_held(
    my_url: str, runs_dir: pathlib.Path, workers_for: object
) -> None:
    # A killed worker's claimed jobs run again once their reservations lapse: at
    # most what it held, its threads plus the jobs it claimed ahead (prefetch),
    # including jobs it had finished and not yet acknowledged.
    total, concurrency, prefetch, kills = 10_000, 4, 8, 3
    held_at_most = concurrency + prefetch
    m = manager(my_url)
    for start in range(0, total, 1000):
        m.dispatch_many([Ledger(n) for n in range(start, start + 1000)])
    m.close()
    workers: Workers = workers_for(my_url)  # type: ignore[operator]
    options = (
        f"--concurrency={concurrency}",
        f"--prefetch={prefetch}",
        "--reservation=8",
        "--reclaim-interval=0.5",
        "--sleep=0.2",
    )
    steady = workers.start(*options)
    doomed = workers.start(*options)

    def ran_in(proc: subprocess.Popen[str]) -> int:
        path = runs_dir / f"{proc.pid}.runs"
        return len(path.read_text().splitlines()) if path.exists() else 0

    for kill in range(kills):
        # Early enough that over half the jobs are left after the last kill.
        threshold = total * 15 * (kill + 1) // 100
        wait_until(
            lambda t=threshold, p=doomed: ran_in(p) >= 100 and sum(workers.runs().values()) >= t,
            timeout=60,
            interval=0.1,
            message=f"{threshold} runs, the doomed worker mid-drain",
        )
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
        doomed = workers.start(*options)
    queue = DatabaseQueue.from_url(my_url)
    try:
        wait_until(lambda: queue.size() == 0, timeout=90, interval=0.2, message="the queue to drain")
        assert queue.failed_count() == 0
    finally:
        queue.close()
    for proc in (steady, doomed):
        proc.send_signal(signal.SIGTERM)
        workers.finish(proc, timeout=60)
    runs = workers.runs()
    lost = sorted(set(range(total)) - set(runs))
    assert not lost, f"{len(lost)} jobs never ran: {lost[:10]}"
    reruns = {n: count - 1 for n, count in runs.items() if count > 1}
    assert sum(reruns.values()) <= kills * held_at_most, (
        f"{sum(reruns.values())} re-runs after {kills} kills, more than {held_at_most} per kill: {list(reruns)[:20]}"
    )
