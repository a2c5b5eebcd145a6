"""What the benchmark scripts share: a no-op job, a latency probe, a percentile."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rainier_sync import Job, JobContext

#: ``time.perf_counter()`` at the start of each probe's ``handle``.
started_at: list[float] = []
#: Set by each probe when it starts.
probe_started = threading.Event()


@dataclass
class Noop(Job):
    NAME = "bench.noop"

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class Probe(Job):
    NAME = "bench.probe"

    def handle(self, context: JobContext) -> None:
        started_at.append(time.perf_counter())
        probe_started.set()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
