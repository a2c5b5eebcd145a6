"""Prometheus metrics fed by the worker's signals (memory driver)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from freezegun import freeze_time
from prometheus_client import CollectorRegistry

from rainier_sync import Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.metrics import Metrics, install_metrics
from rainier_sync.middleware import Skip

from . import jobs

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Skippable(Job):
    NAME = "tests.skippable"

    skip: bool = True

    def middleware(self) -> list[Any]:
        return [Skip.when(lambda job: job.skip)]

    def handle(self, context: JobContext) -> None:
        jobs.calls.append(("skippable", self.skip))


@pytest.fixture
def prom() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(prom: CollectorRegistry, manager: QueueManager, registry: JobRegistry) -> Iterator[Metrics]:
    registry.register(Skippable)
    installed = install_metrics(prom, manager, depth_interval=60)
    yield installed
    installed.uninstall()


def once(manager: QueueManager) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, concurrency=2)).run()


def value(prom: CollectorRegistry, name: str, **labels: str) -> float:
    found = prom.get_sample_value(name, {"connection": "main", **labels})
    return 0.0 if found is None else found


def test_counters_and_histograms_by_job_queue_and_outcome(
    metrics: Metrics, prom: CollectorRegistry, manager: QueueManager
) -> None:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        manager.dispatch(jobs.Record(value=1))
        manager.dispatch(jobs.Record(value=2))
        manager.dispatch(jobs.Flaky(succeed_on=2))  # fixed(5) backoff
        manager.dispatch(jobs.BrokenFailed())  # one try
        manager.dispatch(Skippable())
        frozen.tick(3)  # every first attempt waits 3 s
        stats = once(manager)
        assert (stats.processed, stats.released, stats.failed) == (2, 1, 1)
        frozen.tick(5)
        assert once(manager).processed == 1

    record = {"job": jobs.Record.NAME, "queue": "default"}
    flaky = {"job": jobs.Flaky.NAME, "queue": "default"}
    broken = {"job": jobs.BrokenFailed.NAME, "queue": "default"}
    skippable = {"job": Skippable.NAME, "queue": "default"}
    assert value(prom, "rainier_sync_jobs_dispatched_total", **record) == 2
    assert value(prom, "rainier_sync_jobs_dispatched_total", **flaky) == 1
    assert value(prom, "rainier_sync_jobs_total", outcome="processed", **record) == 2
    assert value(prom, "rainier_sync_jobs_total", outcome="released", **flaky) == 1
    assert value(prom, "rainier_sync_jobs_total", outcome="processed", **flaky) == 1
    assert value(prom, "rainier_sync_jobs_total", outcome="failed", **broken) == 1
    assert value(prom, "rainier_sync_jobs_total", outcome="skipped", **skippable) == 1
    assert value(prom, "rainier_sync_jobs_total", outcome="failed", **record) == 0

    # Run time: processed from the signal's duration, failures measured from job_processing.
    assert value(prom, "rainier_sync_job_run_seconds_count", outcome="processed", **record) == 2
    assert value(prom, "rainier_sync_job_run_seconds_count", outcome="released", **flaky) == 1
    assert value(prom, "rainier_sync_job_run_seconds_count", outcome="processed", **flaky) == 1
    assert value(prom, "rainier_sync_job_run_seconds_count", outcome="failed", **broken) == 1
    assert value(prom, "rainier_sync_job_run_seconds_count", outcome="skipped", **skippable) == 0
    assert value(prom, "rainier_sync_job_run_seconds_bucket", outcome="failed", le="+Inf", **broken) == 1

    # Wait time: first attempts only, 3 s by the frozen clock.
    assert value(prom, "rainier_sync_job_wait_seconds_count", **record) == 2
    assert value(prom, "rainier_sync_job_wait_seconds_sum", **record) == pytest.approx(6.0)
    assert value(prom, "rainier_sync_job_wait_seconds_count", **flaky) == 1, "the retry is not a wait"
    assert value(prom, "rainier_sync_job_wait_seconds_bucket", le="2.5", **record) == 0
    assert value(prom, "rainier_sync_job_wait_seconds_bucket", le="5.0", **record) == 2
    assert not metrics._started, "every started attempt was settled"


def test_a_delayed_job_waits_from_its_due_time(
    metrics: Metrics, prom: CollectorRegistry, manager: QueueManager
) -> None:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        manager.dispatch_after(60, jobs.Record())
        frozen.tick(61)
        assert once(manager).processed == 1
    assert value(prom, "rainier_sync_job_wait_seconds_sum", job=jobs.Record.NAME, queue="default") == pytest.approx(1)


def test_queue_depth_is_sampled_and_cached(prom: CollectorRegistry, manager: QueueManager, memory: MemoryQueue) -> None:
    calls: list[str] = []
    counts = memory.counts

    def counting(queue: str) -> Any:
        calls.append(queue)
        return counts(queue)

    memory.counts = counting  # type: ignore[method-assign]
    installed = install_metrics(prom, manager, depth_interval=60)
    try:
        manager.dispatch(jobs.Record())
        manager.dispatch_after(30, jobs.Record())
        manager.dispatch_on("high", jobs.Record())

        def depth(queue: str, state: str) -> float | None:
            return prom.get_sample_value(
                "rainier_sync_queue_jobs", {"connection": "main", "queue": queue, "state": state}
            )

        assert (depth("default", "ready"), depth("default", "delayed"), depth("high", "ready")) == (1, 1, 1)
        assert depth("default", "reserved") == 0
        sampled = len(calls)
        manager.dispatch(jobs.Record())
        assert depth("default", "ready") == 1, "cached inside the interval"
        assert len(calls) == sampled
        assert installed.depth is not None
        installed.depth.interval = 0
        assert depth("default", "ready") == 2
    finally:
        installed.uninstall()
    assert prom.get_sample_value("rainier_sync_queue_jobs", {"connection": "main", "queue": "default",
                                                             "state": "ready"}) is None


def test_uninstall_disconnects_and_a_second_install_registers_again(
    prom: CollectorRegistry, manager: QueueManager
) -> None:
    receivers = len(signals.job_processed.receivers)
    installed = install_metrics(prom)
    assert len(signals.job_processed.receivers) == receivers + 1
    installed.uninstall()
    assert len(signals.job_processed.receivers) == receivers
    again = install_metrics(prom)
    manager.dispatch(jobs.Record())
    assert once(manager).processed == 1
    again.uninstall()
    assert prom.get_sample_value("rainier_sync_jobs_total", {}) is None


def test_import_rainier_sync_loads_neither_prometheus_nor_opentelemetry() -> None:
    code = textwrap.dedent(
        """
        import sys
        import rainier_sync, rainier_sync.signals, rainier_sync.worker, rainier_sync.drivers
        print(sorted(m for m in sys.modules if m.split(".")[0] in {"prometheus_client", "opentelemetry"}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_multiprocess_mode_aggregates_what_worker_processes_counted(tmp_path: Any) -> None:
    # Given a worker process that counts into PROMETHEUS_MULTIPROC_DIR
    worker = textwrap.dedent(
        """
        from rainier_sync import QueueManager, Worker, WorkerOptions
        from rainier_sync.drivers import MemoryQueue
        from rainier_sync.metrics import install_metrics
        from tests.core import jobs

        manager = QueueManager({"main": MemoryQueue()}, "main")
        manager.registry.register(jobs.Record)
        install_metrics()
        manager.dispatch(jobs.Record())
        assert Worker(manager, options=WorkerOptions(once=True)).run().processed == 1
        """
    )
    # When another process reads the directory
    reader = textwrap.dedent(
        """
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        labels = {"job": "tests.record", "queue": "default", "connection": "main"}
        print(registry.get_sample_value("rainier_sync_jobs_total", {**labels, "outcome": "processed"}),
              registry.get_sample_value("rainier_sync_job_run_seconds_count", {**labels, "outcome": "processed"}))
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def python(code: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", code]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)

    for _ in range(2):
        done = python(worker)
        assert done.returncode == 0, done.stderr
    done = python(reader)
    # Then it sees both processes' counts
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2.0", "2.0"]
