"""Reliability of the Redis driver under real failures: several worker processes,
a worker killed with SIGKILL, connections cut by ``CLIENT KILL``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rainier_sync import QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers import RedisQueue
from tests.support import wait_until

from . import jobs

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


def start_worker(url: str, prefix: str, reservation: float, concurrency: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.drivers.redis.worker_process",
            url,
            prefix,
            str(reservation),
            str(concurrency),
            mode,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def runs(client: redis.Redis, prefix: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.hgetall(prefix + "ran").items()}


def test_two_worker_processes_run_each_of_20000_jobs_exactly_once(
    redis_url: str, redis_client: redis.Redis, prefix: str, processes: list[subprocess.Popen[str]]
) -> None:
    producer = RedisQueue.from_url(redis_url, prefix=prefix)
    manager = QueueManager({"redis": producer}, registry=jobs.registry())
    total = 20_000
    for start in range(0, total, 5000):
        manager.dispatch_many([jobs.Record(prefix, n) for n in range(start, start + 5000)])
    assert producer.size("default") == total
    processes.extend(start_worker(redis_url, prefix, 60, 8, "once") for _ in range(2))
    outputs = [proc.communicate(timeout=120) for proc in processes]
    assert [proc.returncode for proc in processes] == [0, 0], outputs
    counted = runs(redis_client, prefix)
    assert len(counted) == total, f"{total - len(counted)} jobs never ran"
    assert set(counted.values()) == {1}, "a job ran more than once"
    processed = sum(int(out.split("processed=")[1].split()[0]) for out, _ in outputs)
    assert processed == total
    assert producer.size("default") == 0
    producer.close()


def test_a_job_held_by_a_killed_worker_runs_again_once_its_reservation_lapses(
    redis_url: str, redis_client: redis.Redis, prefix: str, processes: list[subprocess.Popen[str]]
) -> None:
    producer = RedisQueue.from_url(redis_url, prefix=prefix)
    QueueManager({"redis": producer}, registry=jobs.registry()).dispatch(jobs.Hang(prefix))
    first = start_worker(redis_url, prefix, 1.5, 2, "forever")
    processes.append(first)
    wait_until(lambda: redis_client.get(prefix + "hanging-pid") is not None, timeout=30, message="the job to start")
    assert int(redis_client.get(prefix + "hanging-pid")) == first.pid
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    assert producer.counts("default").reserved == 1, "the dead worker's reservation is still on record"
    second = start_worker(redis_url, prefix, 1.5, 2, "forever")
    processes.append(second)
    wait_until(
        lambda: redis_client.get(prefix + "finished-attempt") is not None, timeout=30, message="the job to run again"
    )
    assert redis_client.get(prefix + "finished-attempt") == b"2"
    second.send_signal(signal.SIGTERM)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert producer.size("default") == 0 and producer.failed_count() == 0
    producer.close()


def _drain_while_killing_connections(
    redis_url: str, redis_client: redis.Redis, prefix: str, *, reconnect: bool, total: int = 3000
) -> tuple[list[dict[str, object]], dict[int, int], int]:
    options = {"reconnect": True, "reconnect_attempts": 10, "reconnect_max_backoff_ms": 200} if reconnect else {}
    driver = RedisQueue.from_url(redis_url, prefix=prefix, reservation=1, **options)  # type: ignore[arg-type]
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(redis_url))
    manager.dispatch_many([jobs.Record(prefix, n) for n in range(total)])
    reported: list[dict[str, object]] = []

    def on_failed(sender: object, **kwargs: object) -> None:
        reported.append(kwargs)

    signals.queue_operation_failed.connect(on_failed)
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=8, sleep=0.1, reclaim_interval=0.3))
    worker.start()
    name = f"rainier-queue-{driver.consumer}"
    kills = 0
    stop_killing = threading.Event()

    def kill_loop() -> None:
        nonlocal kills
        while not stop_killing.is_set() and (reconnect and kills < 30 or not reconnect and not reported):
            for client in redis_client.client_list():
                if client.get("name") == name:
                    try:
                        redis_client.client_kill_filter(_id=client["id"])
                        kills += 1
                    except redis.ResponseError:
                        pass  # already gone
            stop_killing.wait(0.01)

    killer = threading.Thread(target=kill_loop)
    killer.start()
    try:
        wait_until(lambda: len(runs(redis_client, prefix)) == total, timeout=60, interval=0.05, message="the drain")
    finally:
        stop_killing.set()
        killer.join(10)
        worker.stop()
        worker.join(30)
        signals.queue_operation_failed.disconnect(on_failed)
        manager.close()
    return reported, runs(redis_client, prefix), kills


def test_with_reconnect_a_worker_rides_out_killed_connections(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    reported, counted, kills = _drain_while_killing_connections(redis_url, redis_client, prefix, reconnect=True)
    assert kills > 0
    assert reported == [], "reconnect retried every operation the kills interrupted"
    assert len(counted) == 3000 and min(counted.values()) >= 1


def test_without_reconnect_a_killed_connection_is_reported_never_silent(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    reported, counted, kills = _drain_while_killing_connections(redis_url, redis_client, prefix, reconnect=False)
    assert kills > 0
    assert reported, "the interrupted operation was reported as queue_operation_failed"
    assert all(r["connection"] == "redis" for r in reported)
    assert any("Connection" in str(r["error"]) for r in reported), reported
    assert len(counted) == 3000, "nothing accepted was lost: every job still ran"
