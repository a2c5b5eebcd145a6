"""OpenTelemetry spans fed by the manager's and the worker's signals (memory driver)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from freezegun import freeze_time
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rainier_sync import Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.tracing import META_KEY, Tracing, install_tracing
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
    registry.register(Timed)
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
