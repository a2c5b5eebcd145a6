"""Worker processes against tansu: rebalances, kill -9, SIGTERM, a broker restart and a broker kill -9,
counted on a ledger.

Every attempt of a job appends its number to a ledger file as it ends. A job
missing from the ledger was lost; a number on it twice is a job run again.
The bound the driver documents (docs/drivers/kafka.rst): a crash runs again
at most the jobs its worker held, ``concurrency + prefetch``.
"""

from __future__ import annotations

import collections
import os
import pathlib
import re
import signal
import subprocess
import sys
import uuid
from typing import Any, Iterator

import pytest

from rainier_sync import Container, QueueManager, Worker, WorkerOptions
from rainier_sync.locks import MemoryLockStore
from tests.support import wait_until

from . import app

pytest.importorskip("confluent_kafka")
pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[3]


def lines(path: pathlib.Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []


class Workers:
    """Worker processes of one group, writing to one ledger."""

    def __init__(self, brokers: str, names: dict[str, str], lock_url: str, tmp: pathlib.Path, *options: str) -> None:
        self.brokers, self.names, self.lock_url, self.options = brokers, names, lock_url, options
        self.ledger, self.log = tmp / "ledger.txt", tmp / "workers.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, *extra: str, ledger: pathlib.Path | None = None) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.drivers.kafka.app", self.brokers, self.names["group"],
                 self.names["prefix"], self.lock_url, self.names["locks"], str(ledger or self.ledger),
                 *self.options, *extra],
                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        self.procs.append(proc)
        return proc

    def ran(self) -> list[int]:
        return lines(self.ledger)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""


@pytest.fixture
def workers(kafka_brokers: str, redis_url: str, shared_locks: Any, names: dict[str, str],
            tmp_path: pathlib.Path) -> Iterator[Any]:
    made: list[Workers] = []

    def make(*options: str) -> Workers:
        made.append(Workers(kafka_brokers, names, redis_url, tmp_path, *options))
        return made[-1]

    try:
        yield make
    finally:
        for group in made:
            group.stop()


def driver(brokers: str, names: dict[str, str], **options: Any) -> Any:
    # One record per producer batch: tansu's end offsets are right only then
    # (see docs/drivers/kafka.rst), and the dead-letter listing reads to them.
    return app.build(brokers, names["group"], names["prefix"], MemoryLockStore(),
                     producer_config={"batch.num.messages": 1}, **options)


def dispatch(brokers: str, names: dict[str, str], count: int, tries: int = 1, batched: bool = False) -> None:
    queue = driver(brokers, names) if not batched else app.build(brokers, names["group"], names["prefix"],
                                                                   MemoryLockStore())
    manager = QueueManager({"kafka": queue}, registry=app.registry(), container=Container())
    saved = app.Record.TRIES
    app.Record.TRIES = tries
    try:
        for start in range(0, count, 1000):
            manager.dispatch_many([app.Record(n=i) for i in range(start, min(count, start + 1000))])
    finally:
        app.Record.TRIES = saved
        manager.close()


def failed_ids(brokers: str, names: dict[str, str]) -> list[Any]:
    queue = driver(brokers, names)
    try:
        return list(queue.failed_jobs(100_000))
    finally:
        queue.close()


@pytest.mark.redis
def test_two_workers_drain_5000_jobs_each_exactly_once(
    kafka_brokers: str, names: dict[str, str], workers: Any, tmp_path: pathlib.Path
) -> None:
    total = 5000
    dispatch(kafka_brokers, names, total)
    group = workers("--work-ms", "1", "--lease", "6")
    gate, out_b = tmp_path / "gate", tmp_path / "b.txt"
    # The first worker runs 500 jobs, then its jobs wait at the gate: it cannot
    # finish the drain before the second has joined and taken partitions over.
    first = group.spawn("--gate", str(gate), "--gate-after", "500")
    wait_until(lambda: len(group.ran()) >= 500, timeout=60, interval=0.02, message="the first worker to start")
    second = group.spawn(ledger=out_b)
    wait_until(lambda: len(lines(out_b)) > 0, timeout=60, interval=0.02,
               message=f"the second worker to join and run a job (log: {group.tail()})")
    gate.touch()
    wait_until(lambda: len(group.ran()) + len(lines(out_b)) >= total, timeout=80, interval=0.1,
               message=f"{total} jobs to run (log: {group.tail()})")
    group.stop()
    ran = collections.Counter(group.ran() + lines(out_b))
    assert set(ran) == set(range(total)), "every job runs"
    twice = sorted(n for n, c in ran.items() if c > 1)
    assert twice == [], f"{len(twice)} job(s) ran twice with nobody crashing: {twice[:20]}"
    assert first.returncode == 0 and second.returncode == 0, group.tail()


@pytest.mark.redis
def test_kill_9_three_times_mid_drain_loses_no_job_and_runs_again_at_most_the_jobs_held(
    kafka_brokers: str, names: dict[str, str], workers: Any, record_property: Any
) -> None:
    total, concurrency, prefetch, kills = 5000, 4, 16, 3
    dispatch(kafka_brokers, names, total, tries=kills + 1)
    group = workers("--concurrency", str(concurrency), "--prefetch", str(prefetch), "--work-ms", "2",
                    "--lease", "6")
    live = group.spawn()
    wait_until(lambda: len(group.ran()) >= 800, timeout=60, interval=0.02, message="the worker to get going")
    for kill in range(kills):
        # Each kill comes inside the lease of the one before: the jobs the dead
        # worker held still hold their partitions' commits back, so what its
        # successor finishes meanwhile is not committed when it dies in turn.
        group.kill(live)
        live = group.spawn()
        mark = len(group.ran())
        if kill < kills - 1:
            wait_until(lambda mark=mark: len(group.ran()) >= mark + 700, timeout=60, interval=0.02,
                       message=f"progress after kill {kill + 1} (log: {group.tail()})")
    wait_until(lambda: len(set(group.ran())) >= total, timeout=70, interval=0.1,
               message=f"every job to run after {kills} kills (log: {group.tail()})")
    group.stop()
    ran = collections.Counter(group.ran())
    assert set(ran) == set(range(total)), "no job lost"
    again = sum(c - 1 for c in ran.values())
    record_property("ran_again", again)
    print(f"\nkill -9 x{kills}: {total} jobs, {again} ran again")
    bound = kills * (concurrency + prefetch)
    assert again <= bound, f"{again} jobs ran again; at most {bound} were held by the killed workers"
    assert failed_ids(kafka_brokers, names) == []


@pytest.mark.redis
def test_kill_9_fails_as_crashed_only_the_jobs_its_worker_held(
    kafka_brokers: str, names: dict[str, str], workers: Any, tmp_path: pathlib.Path
) -> None:
    total, concurrency, prefetch = 2000, 4, 8
    dispatch(kafka_brokers, names, total, tries=1)
    hold = tmp_path / "hold"
    group = workers("--concurrency", str(concurrency), "--prefetch", str(prefetch), "--lease", "10")
    # Job 0 never ends on the first worker: its partition's commit stays below
    # it while the jobs behind it finish.
    first = group.spawn("--hold", "0", "--hold-file", str(hold))
    wait_until(lambda: len(group.ran()) >= 1500, timeout=60, interval=0.02, message="the drain to get going")
    group.kill(first)
    before = set(group.ran())
    hold.touch()
    group.spawn()
    wait_until(lambda: len(set(group.ran())) + len(failed_ids(kafka_brokers, names)) >= total, timeout=60,
               interval=0.5, message=f"every job to run or fail (log: {group.tail()})")
    group.stop()
    failed = failed_ids(kafka_brokers, names)
    assert all(f.exception.crashed for f in failed)
    numbers = {f.payload["n"] for f in failed}
    assert len(failed) <= concurrency + prefetch, (
        f"{len(failed)} jobs failed as crashed, {len(numbers & before)} of which had run; the killed worker held "
        f"at most {concurrency + prefetch}"
    )
    assert 0 in numbers, "the job running at the kill used its only attempt"
    assert set(group.ran()) | numbers == set(range(total)), "every job ran or is in the failed store"


@pytest.mark.redis
def test_sigterm_hands_jobs_claimed_ahead_back_without_spending_a_try(
    kafka_brokers: str, names: dict[str, str], workers: Any
) -> None:
    total = 600
    dispatch(kafka_brokers, names, total, tries=1)
    group = workers("--concurrency", "2", "--prefetch", "20", "--work-ms", "20", "--lease", "10")
    first = group.spawn()
    wait_until(lambda: len(group.ran()) >= 60, timeout=60, interval=0.02, message="the worker to get going")
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0, group.tail()
    handed = [int(n) for n in re.findall(r"gave back (\d+) job", group.tail())]
    assert sum(handed) > 0, f"the worker had jobs claimed ahead when it stopped: {group.tail()}"
    group.spawn("--work-ms", "1")
    wait_until(lambda: len(set(group.ran())) >= total, timeout=60, interval=0.1,
               message=f"every job to run after the restart (log: {group.tail()})")
    group.stop()
    ran = collections.Counter(group.ran())
    assert set(ran) == set(range(total))
    assert [n for n, c in ran.items() if c > 1] == [], "a job handed back unstarted runs once"
    assert failed_ids(kafka_brokers, names) == [], "handing a job back spends none of its tries"


def no_lease_held(store: MemoryLockStore) -> bool:
    """True when no job lease is live in ``store`` (every finished job's has lapsed)."""
    with store._mutex:
        keys = [key for key in store._locks if ":lease:" in key]
    return all(store.owner(key) is None for key in keys)


@pytest.mark.sqs
@pytest.mark.parametrize("how", ["sigint", "kill-9", "kill-9-down-past-the-leases"])
def test_a_broker_restart_mid_drain_loses_no_job_and_commits_to_the_end(
    tansu_s3: Any, tmp_path: pathlib.Path, record_property: Any, how: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    names = {"group": f"r-{tag}", "prefix": f"r-{tag}.", "locks": ""}
    total, concurrency, prefetch = 2000, 4, 16
    # In batches, as an application dispatches: tansu on S3 reads a fetch one stored
    # batch at a time (see tests/services/tansu.py), and its end offsets are then
    # wrong, so the worker cannot learn from the broker which records it ran.
    dispatch(tansu_s3.bootstrap, names, total, tries=3, batched=True)
    out = tmp_path / "ran.txt"
    app._out.update(fd=os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), work=0.002)
    queue = driver(tansu_s3.bootstrap, names, lease=3 if how.endswith("leases") else 10)
    manager = QueueManager({"kafka": queue}, registry=app.registry(), container=Container())
    worker = Worker(manager, options=WorkerOptions(queues=["drain"], concurrency=concurrency, prefetch=prefetch,
                                                   sleep=0.2, grace=5))
    worker.start()
    try:
        wait_until(lambda: len(lines(out)) >= 500, timeout=60, interval=0.02, message="the worker to get going")
        if how == "sigint":
            tansu_s3.restart()
        elif how == "kill-9":
            tansu_s3.restart(crash=True)
        else:
            # Down long enough for the worker's session to time out (its partitions
            # are taken away, its commits meanwhile refused) while it finishes the
            # jobs it had read, and for their leases to lapse: all the worker has
            # then to go by, when the broker hands the partitions back from their
            # last committed offsets, are the done markers.
            tansu_s3.kill()
            session = queue._session
            wait_until(lambda: not session._parts, timeout=30, interval=0.05,
                       message="the worker's session to time out with the broker down")
            wait_until(lambda: no_lease_held(queue.locks), timeout=60, interval=0.1,
                       message="the finished jobs' leases to lapse")
            tansu_s3.start(tansu_s3.port)
        wait_until(lambda: len(set(lines(out))) >= total, timeout=70, interval=0.1,
                   message="every job to run after the broker restart")

        def committed_to_the_end() -> bool:
            from confluent_kafka import TopicPartition

            topic = queue.topic("drain")
            tps = [TopicPartition(topic, p) for p in range(4)]
            with queue._inspect_lock:
                offsets = queue._inspect().committed(tps, timeout=10)
            return sum(max(0, tp.offset) for tp in offsets) == total

        wait_until(committed_to_the_end, timeout=30, interval=0.2,
                   message="the group's commits to reach the end of every partition")
    finally:
        worker.stop()
        worker.join(15)
        manager.close()
        os.close(app._out["fd"])
        app._out.update(work=0.0)
    # The ledger: one line per attempt that ran to its end, by job.
    ran = collections.Counter(lines(out))
    assert set(ran) == set(range(total)), f"no job lost: {sorted(set(range(total)) - set(ran))[:20]}"
    again = sum(c - 1 for c in ran.values())
    record_property("ran_again", again)
    print(f"\nbroker {how}: {total} jobs, {again} ran again")
    assert again <= concurrency + prefetch, f"{again} jobs ran again; the worker held at most {concurrency + prefetch}"
