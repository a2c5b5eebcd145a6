"""OpenTelemetry traces, as receivers of :mod:`rainier_sync.signals`.

Needs the ``otel`` extra (``opentelemetry-api``; an SDK and an exporter come
from the application)::

    from rainier_sync.tracing import install_tracing
    install_tracing()                       # the global tracer provider

Each dispatched job gets a ``rainier_sync dispatch <name>`` PRODUCER span, a
child of whatever span is current where it is dispatched; its context is
injected into ``job.meta["trace"]`` and travels with the job. Each attempt
gets a ``rainier_sync process <name>`` CONSUMER span, a child of that context,
started on ``job_processing`` and ended when the attempt is settled, with the
outcome as an attribute and an ERROR status when the attempt failed. The
attempt's span is the current span while ``handle`` (and ``failed()``) runs, in
the thread that runs it: spans the job starts are its children. A job with a
time limit runs in a timeout child, which gets the span's context in
``job.meta["trace_attempt"]``; install tracing before the worker starts, so the
child (forked from the worker) has it too.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Iterator

from . import __version__, signals
from .errors import DriverUnavailableError
from .scopes import add_attempt_scope, remove_attempt_scope

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError(
        "rainier_sync.tracing needs opentelemetry-api: pip install 'rainier_sync[otel]'"
    ) from exc

if TYPE_CHECKING:
    from .types import ExceptionInfo, QueuedJob

__all__ = ["Tracing", "install_tracing", "META_KEY", "ATTEMPT_META_KEY"]

#: The key of ``QueuedJob.meta`` that carries the dispatch span's context.
META_KEY = "trace"
#: The key that carries the running attempt's span context (to a timeout child).
ATTEMPT_META_KEY = "trace_attempt"

_SYSTEM = "rainier_sync"


def _attributes(job: QueuedJob, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": _SYSTEM,
        "messaging.operation.type": operation,
        "messaging.destination.name": job.queue,
        "messaging.message.id": job.id,
        "rainier_sync.job.name": job.name,
        "rainier_sync.connection": job.connection,
    }


class Tracing:
    """The tracer and the receivers that open and close spans.

    ``tracer_provider`` is the provider to take the tracer from (the global
    one when None). Open attempt spans are kept by ``(job id, attempt)``.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("rainier_sync", __version__, tracer_provider=tracer_provider)
        self._spans: dict[tuple[str, int], Span] = {}
        self._lock = threading.Lock()
        self._installed = False

    def install(self) -> Tracing:
        """Connect the receivers (once)."""
        if not self._installed:
            for signal, receiver in self._receivers():
                signal.connect(receiver, weak=False)
            add_attempt_scope(self.current)
            self._installed = True
        return self

    def uninstall(self) -> None:
        """Disconnect the receivers and end the spans still open."""
        if not self._installed:
            return
        for signal, receiver in self._receivers():
            signal.disconnect(receiver)
        remove_attempt_scope(self.current)
        self._installed = False
        with self._lock:
            spans, self._spans = self._spans, {}
        for span in spans.values():
            span.end()

    def _receivers(self) -> list[tuple[Any, Any]]:
        return signals.lifecycle_receivers(self)

    # -- receivers -------------------------------------------------------------------
    def _on_dispatching(self, sender: Any, jobs: list[QueuedJob], **extra: Any) -> None:
        for job in jobs:
            span = self.tracer.start_span(
                f"rainier_sync dispatch {job.name}", kind=SpanKind.PRODUCER, attributes=_attributes(job, "send")
            )
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span))
            span.end()
            if carrier:
                # A new dict: copies of a job share their meta.
                job.meta = {**(job.meta or {}), META_KEY: carrier}

    def _on_processing(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        carrier = (job.meta or {}).get(META_KEY)
        parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
        attributes = _attributes(job, "process")
        attributes["rainier_sync.job.attempt"] = job.attempts
        span = self.tracer.start_span(
            f"rainier_sync process {job.name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        )
        with self._lock:
            # An attempt abandoned unannounced is ended when the next one starts.
            stale = self._spans.pop((job.id, job.attempts - 1), None)
            replaced = self._spans.pop((job.id, job.attempts), None)
            self._spans[(job.id, job.attempts)] = span
        for old in (stale, replaced):
            if old is not None:
                old.set_attribute("rainier_sync.outcome", "abandoned")
                old.end()
        own: dict[str, str] = {}
        propagate.inject(own, context=trace.set_span_in_context(span))
        if own:
            # For a timeout child, which has no span of its own; a new dict: copies of a job share their meta.
            job.meta = {**(job.meta or {}), ATTEMPT_META_KEY: own}

    def current(self, job: QueuedJob) -> contextlib.AbstractContextManager[None]:
        """Make ``job``'s attempt span current (an attempt scope, entered in the
        thread that runs ``handle``): the span itself here, its context carried
        in the job's meta in a timeout child."""
        # Not under the lock: a timeout child is forked from a process where another thread may hold it.
        span = self._spans.get((job.id, job.attempts))
        if span is not None:
            return _attached(trace.set_span_in_context(span))
        carrier = (job.meta or {}).get(ATTEMPT_META_KEY)
        if not isinstance(carrier, dict):
            return contextlib.nullcontext()
        return _attached(propagate.extract(carrier))

    def _settled(self, job: QueuedJob, outcome: str, info: ExceptionInfo | None = None, **attributes: Any) -> None:
        with self._lock:
            span = self._spans.pop((job.id, job.attempts), None)
        if span is None:
            return  # not started in this process (a lost attempt failed on reclaim)
        span.set_attribute("rainier_sync.outcome", outcome)
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(f"rainier_sync.{key}", value)
        if info is not None:
            span.add_event(
                "exception",
                {
                    "exception.type": info.kind,
                    "exception.message": info.message,
                    "exception.stacktrace": info.traceback or "",
                },
            )
            span.set_status(Status(StatusCode.ERROR, info.error))
        span.end()

    def _on_processed(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "processed")

    def _on_released(self, sender: Any, job: QueuedJob, exception: ExceptionInfo, delay: float, **extra: Any) -> None:
        self._settled(job, "released", exception, delay=float(delay))

    def _on_failed(self, sender: Any, job: QueuedJob, exception: ExceptionInfo, **extra: Any) -> None:
        self._settled(job, "failed", exception)

    def _on_deferred(self, sender: Any, job: QueuedJob, delay: float, reason: Any = None, **extra: Any) -> None:
        self._settled(job, "deferred", delay=float(delay), reason=None if reason is None else str(reason))

    def _on_skipped(self, sender: Any, job: QueuedJob, reason: Any = None, **extra: Any) -> None:
        self._settled(job, "skipped", reason=None if reason is None else str(reason))

    def _on_interrupted(self, sender: Any, job: QueuedJob, **extra: Any) -> None:
        self._settled(job, "interrupted")


@contextlib.contextmanager
def _attached(context: otel_context.Context) -> Iterator[None]:
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def install_tracing(tracer_provider: TracerProvider | None = None) -> Tracing:
    """Build :class:`Tracing` over ``tracer_provider`` (the global one when
    None) and connect its receivers; returns it for ``uninstall()``."""
    return Tracing(tracer_provider).install()
