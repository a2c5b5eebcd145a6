"""Prometheus metrics, as receivers of :mod:`rainier_sync.signals`.

Needs the ``prometheus`` extra (``prometheus_client``)::

    from rainier_sync.metrics import install_metrics
    install_metrics(manager=manager)        # the default registry
    prometheus_client.start_http_server(9100)

Exports, labelled by ``job`` (the job's NAME), ``queue`` and ``connection``:

- ``rainier_sync_jobs_dispatched_total``: jobs offered for dispatch.
- ``rainier_sync_jobs_total{outcome}``: settled attempts, ``outcome`` one of
  processed, released, failed, deferred, skipped, interrupted.
- ``rainier_sync_job_run_seconds{outcome}``: run time of attempts that were
  processed, released or failed.
- ``rainier_sync_job_wait_seconds``: first attempts only, from dispatch (or
  the due time of a delayed job) to the start.
- ``rainier_sync_queue_jobs{state}``: ready, delayed and reserved jobs per
  queue, sampled by :class:`QueueDepthCollector` at most every ``interval``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import _clock, signals
from .errors import DriverUnavailableError

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError(
        "rainier_sync.metrics needs prometheus_client: pip install 'rainier_sync[prometheus]'"
    ) from exc

if TYPE_CHECKING:
    from .manager import QueueManager
    from .types import QueuedJob

__all__ = ["Metrics", "QueueDepthCollector", "install_metrics", "RUN_BUCKETS", "WAIT_BUCKETS"]

log = logging.getLogger("rainier_sync")

#: Run-time buckets, in seconds: from a quick job to a long batch.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Wait-time buckets, in seconds: from a worker that keeps up to a backlog of hours.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)

_LABELS = ("job", "queue", "connection")
_STATES = ("ready", "delayed", "reserved")


class QueueDepthCollector(Collector):
    """``rainier_sync_queue_jobs{connection, queue, state}``, read from each of
    the manager's connections with ``driver.counts(queue)``.

    A scrape inside ``interval`` seconds of the last sample gets the cached one,
    so a busy scraper never adds load to the backend. The queues are
    ``queues`` when given, else what each driver lists (``queue_names()``),
    plus every queue a job was seen on in this process.
    """

    def __init__(
        self, manager: QueueManager, queues: Sequence[str] | None = None, *, interval: float = 5.0, namespace: str = ""
    ) -> None:
        self.manager = manager
        self.queues = list(queues) if queues is not None else None
        self.interval = interval
        self.name = f"{namespace}rainier_sync_queue_jobs"
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()  # guards _seen
        self._sampling = threading.Lock()  # one backend read at a time; held across I/O
        self._sampled_at: float | None = None
        self._samples: list[tuple[str, str, str, int]] = []

    def saw(self, connection: str, queue: str) -> None:
        """Remember a queue a job was met on (cheap: called for every job)."""
        known = self._seen.get(connection)
        if known is None or queue not in known:
            with self._lock:
                self._seen.setdefault(connection, set()).add(queue)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        # Without this, a registry with auto_describe (the default one) would sample at registration.
        return [self._family()]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = self._family()
        for connection, queue, state, value in self.sample():
            family.add_metric([connection, queue, state], value)
        return [family]

    def sample(self) -> list[tuple[str, str, str, int]]:
        """``(connection, queue, state, count)`` rows, at most ``interval`` seconds old."""
        with self._sampling:
            now = _clock.monotonic()
            if self._sampled_at is not None and now - self._sampled_at < self.interval:
                return self._samples
            self._samples = list(self._read())
            self._sampled_at = _clock.monotonic()
            return self._samples

    def _read(self) -> Iterator[tuple[str, str, str, int]]:
        for connection, driver in self.manager.connections.items():
            if self.queues is not None:
                queues = set(self.queues)
            else:
                try:
                    queues = set(driver.queue_names())
                except Exception as exc:  # noqa: BLE001 - a scrape must not fail for one backend
                    log.warning("queue depth: could not list the queues of %r: %s", connection, exc)
                    queues = set()
                with self._lock:
                    queues |= self._seen.get(connection, set())
            for queue in sorted(queues):
                try:
                    counts = driver.counts(queue)
                except Exception as exc:  # noqa: BLE001 - a scrape must not fail for one backend
                    log.warning("queue depth: could not count %r on %r: %s", queue, connection, exc)
                    continue
                yield connection, queue, "ready", counts.ready
                yield connection, queue, "delayed", counts.delayed
                yield connection, queue, "reserved", counts.reserved

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            self.name, "Jobs in a queue, by state (sampled)", labels=["connection", "queue", "state"]
        )


class Metrics:
    """The counters and histograms, and the receivers that feed them.

    ``registry`` is where they register (prometheus_client's default one when
    None); ``manager``, when given, adds a :class:`QueueDepthCollector` over
    its connections (``queues`` and ``depth_interval`` are passed to it).
    Receivers are connected by :meth:`install` and disconnected, with the
    metrics unregistered, by :meth:`uninstall`.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        manager: QueueManager | None = None,
        *,
        queues: Sequence[str] | None = None,
        depth_interval: float = 5.0,
        namespace: str = "",
        run_buckets: Sequence[float] = RUN_BUCKETS,
        wait_buckets: Sequence[float] = WAIT_BUCKETS,
    ) -> None:
        self.registry = registry if registry is not None else REGISTRY
        prefix = f"{namespace}_rainier_sync" if namespace else "rainier_sync"
        self.dispatched = Counter(f"{prefix}_jobs_dispatched", "Jobs offered for dispatch", _LABELS, registry=None)
        self.jobs = Counter(f"{prefix}_jobs", "Settled attempts, by outcome", (*_LABELS, "outcome"), registry=None)
        self.run_time = Histogram(
            f"{prefix}_job_run_seconds",
            "Run time of an attempt, by outcome (processed, released, failed)",
            (*_LABELS, "outcome"),
            buckets=run_buckets,
            registry=None,
        )
        self.wait_time = Histogram(
            f"{prefix}_job_wait_seconds",
            "Time from dispatch (or the due time of a delayed job) to the start of its first attempt",
            _LABELS,
            buckets=wait_buckets,
            registry=None,
        )
        self.depth: QueueDepthCollector | None = None
        if manager is not None:
            self.depth = QueueDepthCollector(
                manager, queues, interval=depth_interval, namespace=f"{namespace}_" if namespace else ""
            )
        self._started: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._installed = False

    @property
    def collectors(self) -> list[Collector]:
        found: list[Collector] = [self.dispatched, self.jobs, self.run_time, self.wait_time]
        if self.depth is not None:
            found.append(self.depth)
        return found

    def install(self) -> Metrics:
        """Register the metrics and connect the receivers (once)."""
        if self._installed:
            return self
        registered: list[Collector] = []
        try:
            for collector in self.collectors:
                self.registry.register(collector)
                registered.append(collector)
        except BaseException:
            for collector in registered:
                self.registry.unregister(collector)
            raise
        for signal, receiver in self._receivers():
            signal.connect(receiver, weak=False)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Disconnect the receivers and unregister the metrics."""
        if not self._installed:
            return
        for signal, receiver in self._receivers():
            signal.disconnect(receiver)
        for collector in self.collectors:
            self.registry.unregister(collector)
        self._installed = False

    def _receivers(self) -> list[tuple[Any, Any]]:
        return signals.lifecycle_receivers(self)

    # -- receivers -------------------------------------------------------------------
    def _on_dispatching(self, sender: Any, jobs: list[QueuedJob], **extra: Any) -> None:
        for job in jobs:
            self.dispatched.labels(job.name, job.queue, job.connection).inc()

    def _on_processing(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        started = _clock.monotonic()
        with self._lock:
            # An attempt abandoned unannounced must not stay here forever.
            self._started.pop((job.id, job.attempts - 1), None)
            self._started[(job.id, job.attempts)] = started
        if self.depth is not None:
            self.depth.saw(job.connection, job.queue)
        if job.attempts <= 1 and job.dispatched_at > 0:
            since = max(job.dispatched_at, job.available_at)
            self.wait_time.labels(job.name, job.queue, job.connection).observe(max(0.0, _clock.now() - since))

    def _settled(self, job: QueuedJob, outcome: str, duration: float | None = None, timed: bool = False) -> None:
        with self._lock:
            started = self._started.pop((job.id, job.attempts), None)
        self.jobs.labels(job.name, job.queue, job.connection, outcome).inc()
        if not timed:
            return
        if duration is None:
            if started is None:
                return  # never started here (a lost attempt failed on reclaim)
            duration = _clock.monotonic() - started
        self.run_time.labels(job.name, job.queue, job.connection, outcome).observe(duration)

    def _on_processed(self, sender: Any, job: QueuedJob, duration: float | None = None, **extra: Any) -> None:
        self._settled(job, "processed", duration, timed=True)

    def _on_released(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "released", timed=True)

    def _on_failed(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "failed", timed=True)

    def _on_deferred(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "deferred")

    def _on_skipped(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "skipped")

    def _on_interrupted(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "interrupted")


def install_metrics(
    registry: CollectorRegistry | None = None,
    manager: QueueManager | None = None,
    *,
    queues: Sequence[str] | None = None,
    depth_interval: float = 5.0,
    namespace: str = "",
) -> Metrics:
    """Build :class:`Metrics`, register them in ``registry`` (the default one
    when None) and connect their receivers; returns them for ``uninstall()``."""
    return Metrics(registry, manager, queues=queues, depth_interval=depth_interval, namespace=namespace).install()
