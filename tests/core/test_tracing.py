"""OpenTelemetry spans fed by the manager's and the worker's signals (memory driver)."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import pytest
from freezegun import freeze_time
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rainier_sync import Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.tracing import ATTEMPT_META_KEY, META_KEY, Tracing, install_tracing
from rainier_sync.worker import child

from . import jobs


@dataclass
class Timed(Job):
    """Runs in a supervised child process."""

    NAME = "tests.timed"
    TIMEOUT = 10

    def handle(self, context: JobContext) -> None:
        assert os.getpid() != Timed.parent_pid, "a timed job runs in a child"

    parent_pid = os.getpid()


def current_ids() -> tuple[int, int]:
    """The trace and span id current where this runs."""
    context = trace.get_current_span().get_span_context()
    return context.trace_id, context.span_id


@dataclass
class SeesItsSpan(Job):
    """Notes the span current in ``handle`` and in ``failed()``."""

    NAME = "tests.sees-its-span"
    TRIES = 1

    fail: bool = False
    seen: ClassVar[dict[str, tuple[int, int]]] = {}

    def handle(self, context: JobContext) -> None:
        SeesItsSpan.seen["handle"] = current_ids()
        if self.fail:
            raise RuntimeError("no")

    def failed(self, context: JobContext, error: BaseException) -> None:
        SeesItsSpan.seen["failed"] = current_ids()


@dataclass
class TimedSeesItsSpan(Job):
    """Runs in a timeout child and writes the span current in ``handle`` to ``path``."""

    NAME = "tests.timed-sees-its-span"
    TIMEOUT = 10

    path: str = ""

    def handle(self, context: JobContext) -> None:
        assert os.getpid() != Timed.parent_pid, "a timed job runs in a child"
        trace_id, span_id = current_ids()
        pathlib.Path(self.path).write_text(f"{trace_id} {span_id}", encoding="utf-8")


@dataclass
class DispatchesOne(Job):
    """Dispatches a Record from ``handle`` (in a timeout child when ``TIMEOUT`` is set)."""

    NAME = "tests.dispatches-one"

    def handle(self, context: JobContext) -> None:
        context.resolve(QueueManager).dispatch(jobs.Record("follow-up"))


@dataclass
class TimedDispatchesOne(DispatchesOne):
    NAME = "tests.timed-dispatches-one"
    TIMEOUT = 10


class NotesTheSpan:
    """A job middleware that notes the span current around the attempt."""

    seen: ClassVar[list[tuple[int, int]]] = []

    def handle(self, job: Job, context: JobContext, call_next: Any) -> None:
        NotesTheSpan.seen.append(current_ids())
        call_next()


@dataclass
class TimedWithMiddleware(Job):
    NAME = "tests.timed-with-middleware"
    TIMEOUT = 10

    def middleware(self) -> list[Any]:
        return [NotesTheSpan()]

    def handle(self, context: JobContext) -> None:
        pass


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def tracing(provider: TracerProvider, registry: JobRegistry) -> Iterator[Tracing]:
    for job_class in (Timed, SeesItsSpan, TimedSeesItsSpan, DispatchesOne, TimedDispatchesOne, TimedWithMiddleware):
        registry.register(job_class)
    SeesItsSpan.seen.clear()
    NotesTheSpan.seen.clear()
    installed = install_tracing(provider)
    yield installed
    installed.uninstall()


def once(manager: QueueManager, **options: Any) -> Any:
    return Worker(manager, options=WorkerOptions(once=True, **options)).run()


def spans(exporter: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.kind is kind]


def assert_child_of(span: ReadableSpan, parent: ReadableSpan) -> None:
    assert span.context is not None and parent.context is not None
    assert span.context.trace_id == parent.context.trace_id
    assert span.parent is not None and span.parent.span_id == parent.context.span_id


def test_an_attempt_is_a_child_of_its_dispatch(
    tracing: Tracing, exporter: InMemorySpanExporter, provider: TracerProvider, manager: QueueManager
) -> None:
    with provider.get_tracer("app").start_as_current_span("request") as request:
        job_id = manager.dispatch(jobs.Record(value=1))
    assert once(manager).processed == 1

    (dispatch,) = spans(exporter, SpanKind.PRODUCER)
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert dispatch.name == f"rainier_sync dispatch {jobs.Record.NAME}"
    assert dispatch.parent is not None and dispatch.parent.span_id == request.get_span_context().span_id
    assert attempt.name == f"rainier_sync process {jobs.Record.NAME}"
    assert_child_of(attempt, dispatch)
    assert attempt.attributes is not None
    assert attempt.attributes["messaging.message.id"] == job_id
    assert attempt.attributes["messaging.destination.name"] == "default"
    assert attempt.attributes["rainier_sync.job.name"] == jobs.Record.NAME
    assert attempt.attributes["rainier_sync.job.attempt"] == 1
    assert attempt.attributes["rainier_sync.outcome"] == "processed"
    assert attempt.status.status_code is StatusCode.UNSET
    assert not tracing._spans


def test_the_trace_context_travels_in_the_envelope(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager, memory: Any
) -> None:
    manager.dispatch(jobs.Record())
    (stored,) = memory.reserve_many(["default"], 1)
    (dispatch,) = spans(exporter, SpanKind.PRODUCER)
    assert dispatch.context is not None
    traceparent = stored.meta[META_KEY]["traceparent"]
    assert traceparent.split("-")[1:3] == [f"{dispatch.context.trace_id:032x}", f"{dispatch.context.span_id:016x}"]


def test_each_attempt_is_a_span_with_its_outcome_and_error(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager
) -> None:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        manager.dispatch(jobs.Flaky(succeed_on=2))  # fixed(5) backoff
        assert once(manager).released == 1
        frozen.tick(5)
        assert once(manager).processed == 1

    (dispatch,) = spans(exporter, SpanKind.PRODUCER)
    first, second = spans(exporter, SpanKind.CONSUMER)
    for attempt in (first, second):
        assert_child_of(attempt, dispatch)
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["rainier_sync.job.attempt"], second.attributes["rainier_sync.job.attempt"]) == (1, 2)
    assert first.attributes["rainier_sync.outcome"] == "released"
    assert first.attributes["rainier_sync.delay"] == 5.0
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "RuntimeError: attempt 1 failed"
    (event,) = first.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    assert "upstream down" in str(event.attributes["exception.stacktrace"])
    assert second.attributes["rainier_sync.outcome"] == "processed"
    assert second.status.status_code is StatusCode.UNSET


def test_a_failed_job_ends_its_span_with_an_error(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager
) -> None:
    manager.dispatch(jobs.BrokenFailed())
    assert once(manager).failed == 1
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert attempt.attributes is not None and attempt.attributes["rainier_sync.outcome"] == "failed"
    assert attempt.status.status_code is StatusCode.ERROR


@pytest.mark.skipif(not child.supported(), reason="supervised children need POSIX fork")
@pytest.mark.timeout(60)
def test_a_timed_job_run_in_a_child_is_traced_too(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager
) -> None:
    manager.dispatch(Timed())
    assert once(manager, concurrency=1).processed == 1
    (dispatch,) = spans(exporter, SpanKind.PRODUCER)
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert_child_of(attempt, dispatch)
    assert attempt.attributes is not None and attempt.attributes["rainier_sync.outcome"] == "processed"
    assert not tracing._spans


def test_uninstall_disconnects(provider: TracerProvider, exporter: InMemorySpanExporter, manager: QueueManager) -> None:
    install_tracing(provider).uninstall()
    manager.dispatch(jobs.Record())
    assert once(manager).processed == 1
    assert exporter.get_finished_spans() == ()


def ids_of(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def test_the_attempt_span_is_current_in_handle_and_failed_in_the_worker_thread(
    tracing: Tracing, exporter: InMemorySpanExporter, provider: TracerProvider, manager: QueueManager
) -> None:
    manager.dispatch(SeesItsSpan(fail=True))
    assert once(manager).failed == 1
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert SeesItsSpan.seen["handle"] == ids_of(attempt)
    assert SeesItsSpan.seen["failed"] == ids_of(attempt)


def test_the_attempt_span_is_current_only_while_the_attempt_runs(
    tracing: Tracing, exporter: InMemorySpanExporter, provider: TracerProvider, manager: QueueManager, memory: Any
) -> None:
    """``drain()`` runs attempts in the caller's thread: its own span is current again after."""
    with provider.get_tracer("app").start_as_current_span("caller") as caller:
        manager.dispatch(SeesItsSpan())
        assert memory.drain() == 1
        assert current_ids() == (caller.get_span_context().trace_id, caller.get_span_context().span_id)
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert SeesItsSpan.seen["handle"] == ids_of(attempt)


@pytest.mark.skipif(not child.supported(), reason="supervised children need POSIX fork")
@pytest.mark.timeout(60)
def test_the_attempt_span_is_current_in_handle_in_a_timeout_child(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager, tmp_path: pathlib.Path
) -> None:
    seen = tmp_path / "seen"
    manager.dispatch(TimedSeesItsSpan(path=str(seen)))
    assert once(manager, concurrency=1).processed == 1
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    trace_id, span_id = (int(part) for part in seen.read_text(encoding="utf-8").split())
    assert (trace_id, span_id) == ids_of(attempt)


def test_the_attempt_context_is_carried_in_the_job_for_a_timeout_child(
    tracing: Tracing, manager: QueueManager, memory: Any
) -> None:
    manager.dispatch(jobs.Record())
    (job,) = memory.reserve_many(["default"], 1)
    assert ATTEMPT_META_KEY not in (job.meta or {})
    dispatched = job.meta[META_KEY]
    signals.emit(signals.job_processing, None, job=job, connection=job.connection)
    attempt = tracing._spans[(job.id, job.attempts)].get_span_context()
    carried = job.meta[ATTEMPT_META_KEY]["traceparent"].split("-")
    assert carried[1:3] == [f"{attempt.trace_id:032x}", f"{attempt.span_id:016x}"]
    assert job.meta[META_KEY] == dispatched, "the next attempt is still a child of the dispatch"


@pytest.mark.parametrize("job", [DispatchesOne(), TimedDispatchesOne()], ids=["in a thread", "in a timeout child"])
@pytest.mark.timeout(60)
def test_a_job_dispatched_by_a_job_continues_its_trace(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager, job: Job
) -> None:
    if isinstance(job, TimedDispatchesOne) and not child.supported():
        pytest.skip("supervised children need POSIX fork")
    manager.container.instance(QueueManager, manager)
    manager.dispatch(job)
    assert once(manager, concurrency=1).processed == 2  # the job and its follow-up
    first, follow_up = spans(exporter, SpanKind.PRODUCER)
    (attempt,) = [s for s in spans(exporter, SpanKind.CONSUMER) if s.name == f"rainier_sync process {job.NAME}"]
    assert follow_up.name == f"rainier_sync dispatch {jobs.Record.NAME}"
    assert_child_of(follow_up, attempt)
    assert_child_of(attempt, first)


@pytest.mark.skipif(not child.supported(), reason="supervised children need POSIX fork")
@pytest.mark.timeout(60)
def test_the_middleware_of_a_timed_job_runs_under_the_attempt_span_in_the_worker(
    tracing: Tracing, exporter: InMemorySpanExporter, manager: QueueManager
) -> None:
    manager.dispatch(TimedWithMiddleware())
    assert once(manager, concurrency=1).processed == 1
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert NotesTheSpan.seen == [ids_of(attempt)]
