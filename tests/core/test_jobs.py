from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
import tenacity

from rainier_sync import (
    Container,
    Job,
    JobContext,
    JobDefinitionError,
    JobRegistry,
    PayloadError,
    QueueManager,
    UnknownJobError,
    backoff,
)

from . import jobs


def test_payload_is_the_dataclass_fields(manager: QueueManager, memory: Any) -> None:
    manager.dispatch(jobs.WithList(items=[1, 2]))
    assert memory.jobs[0].payload == {"items": [1, 2]}
    assert jobs.WithList.from_payload({"items": [3]}) == jobs.WithList(items=[3])


def test_a_field_that_is_not_json_is_refused_at_dispatch_naming_it(manager: QueueManager, memory: Any) -> None:
    with pytest.raises(PayloadError, match=r"field 'value' is not JSON-serialisable \(datetime\)"):
        manager.dispatch(jobs.Record(value=datetime(2026, 1, 1)))
    with pytest.raises(PayloadError, match="field 'value'"):
        manager.dispatch(jobs.Record(value=math.nan))
    assert memory.size() == 0, "a refused dispatch must queue nothing"


def test_a_payload_that_does_not_fit_the_class_names_the_job() -> None:
    with pytest.raises(PayloadError, match="tests.record"):
        jobs.Record.from_payload({"nope": 1})


def test_to_payload_can_be_overridden_for_a_plain_class(registry: JobRegistry, memory: Any) -> None:
    class Plain(Job):
        NAME = "tests.plain"

        def __init__(self, n: int) -> None:
            self.n = n

        def to_payload(self) -> dict[str, Any]:
            return {"n": self.n}

        @classmethod
        def from_payload(cls, payload: dict[str, Any]) -> Plain:
            return cls(payload["n"])

        def handle(self, context: JobContext) -> None:
            jobs.calls.append(("plain", self.n))

    registry.register(Plain)
    manager = QueueManager({"m": memory}, registry=registry, container=Container())
    manager.dispatch(Plain(7))
    assert memory.drain() == 1
    assert jobs.calls == [("plain", 7)]


def test_a_plain_class_without_to_payload_is_refused(manager: QueueManager) -> None:
    class Plain(Job):
        NAME = "tests.plain-no-payload"

    with pytest.raises(PayloadError, match="not a dataclass"):
        manager.dispatch(Plain())


def test_registration_refuses_a_class_without_name() -> None:
    @dataclass
    class Nameless(Job):
        pass

    with pytest.raises(JobDefinitionError, match="Nameless has no NAME"):
        JobRegistry().register(Nameless)


def test_registration_refuses_a_duplicate_name() -> None:
    @dataclass
    class Impostor(Job):
        NAME = "tests.record"

    registry = JobRegistry().with_job(jobs.Record)
    with pytest.raises(JobDefinitionError, match="'tests.record' is already registered to .*Record"):
        registry.register(Impostor)
    registry.register(jobs.Record)  # the same class again is fine


def test_registration_refuses_bad_class_settings() -> None:
    @dataclass
    class NoTries(Job):
        NAME = "tests.no-tries"
        TRIES = 0

    @dataclass
    class BadTimeout(Job):
        NAME = "tests.bad-timeout"
        TIMEOUT = -1

    with pytest.raises(JobDefinitionError, match="TRIES must be an int >= 1"):
        JobRegistry().register(NoTries)
    with pytest.raises(JobDefinitionError, match="TIMEOUT must be a positive number"):
        JobRegistry().register(BadTimeout)
    with pytest.raises(JobDefinitionError, match="not a subclass"):
        JobRegistry().register(int)  # type: ignore[type-var]


def test_registry_lookup_and_decorator() -> None:
    registry = JobRegistry()

    @registry.register
    @dataclass
    class Decorated(Job):
        NAME = "tests.decorated"

    assert "tests.decorated" in registry and registry.get("tests.decorated") is Decorated
    with pytest.raises(UnknownJobError, match="no job named 'missing'"):
        registry.get("missing")


def test_dispatching_a_class_without_name_is_refused(manager: QueueManager) -> None:
    @dataclass
    class Nameless(Job):
        pass

    with pytest.raises(JobDefinitionError, match="has no NAME"):
        manager.dispatch(Nameless())


def test_default_backoff_is_exponential_capped_at_64() -> None:
    job = jobs.Record()
    assert [job.backoff(a) for a in range(1, 9)] == [1, 2, 4, 8, 16, 32, 64, 64]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (backoff.exponential(base=2, cap=10), [2, 4, 8, 10]),
        (backoff.linear(step=5, cap=12), [5, 10, 12, 12]),
        (backoff.fixed(3), [3, 3, 3, 3]),
        (backoff.none, [0, 0, 0, 0]),
        (tenacity.wait_exponential(multiplier=1, min=1, max=5), [1, 2, 4, 5]),
        (tenacity.wait_fixed(7), [7, 7, 7, 7]),
        (2.5, [2.5, 2.5, 2.5, 2.5]),
    ],
)
def test_backoff_strategies(strategy: Any, expected: list[float]) -> None:
    @dataclass
    class WithBackoff(Job):
        NAME = "tests.with-backoff"
        BACKOFF = strategy

    assert [WithBackoff().backoff(a) for a in range(1, 5)] == expected


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="delay"):
        backoff.fixed(-1)
    with pytest.raises(TypeError, match="not a backoff strategy"):
        backoff.resolve("soon")


def test_job_context_is_constructible_directly() -> None:
    container = Container().instance("greeting", "hi")
    context = JobContext(container, "id-1", "mail", 3, 3, connection="c", name="n")
    assert context.resolve("greeting") == "hi"
    assert context.is_last_attempt()
    assert not context.stop_requested.is_set()
    assert JobContext(container, "id-2", "mail", 1, 3).is_last_attempt() is False
    jobs.Record(value=1).handle(context)
    assert jobs.calls == [("record", 1)]


def test_registration_refuses_a_bad_memory_limit() -> None:
    @dataclass
    class Greedy(Job):
        NAME = "tests.greedy"
        MEMORY_LIMIT = -5

    with pytest.raises(JobDefinitionError, match="MEMORY_LIMIT must be a positive number of bytes"):
        JobRegistry().register(Greedy)


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"attempts": -5}, "attempts -5 is outside 0..1000000"),
        ({"attempts": 10**9}, "attempts 1000000000 is outside"),
        ({"attempts": 1.5}, "attempts must be a whole number, got 1.5"),
        ({"max_attempts": 0}, "max_attempts 0 is outside 1..1000000"),
        ({"priority": "x"}, "priority must be a whole number, got 'x'"),
        ({"available_at": "soon"}, "available_at must be a finite number of seconds, got 'soon'"),
        ({"available_at": float("nan")}, "available_at must be a finite number of seconds, got nan"),
        ({"dispatched_at": float("inf")}, "dispatched_at must be a finite number of seconds, got inf"),
    ],
)
def test_an_envelope_with_impossible_counts_or_times_is_unreadable(fields: dict[str, Any], said: str) -> None:
    from rainier_sync import QueuedJob

    envelope = {"id": "j1", "name": "tests.record", "payload": {}, **fields}
    with pytest.raises(PayloadError, match=r"job 'tests.record' \(j1\): malformed envelope: " + re.escape(said)):
        QueuedJob.from_wire(envelope)


def test_an_envelope_nested_too_deeply_to_read_is_unreadable_not_a_recursion_error() -> None:
    from rainier_sync import QueuedJob

    with pytest.raises(PayloadError, match="nested too deeply"):
        QueuedJob.decode('{"id": "j", "name": "n", "payload": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}")


def test_tries_and_priority_no_worker_could_read_back_are_refused(manager: QueueManager) -> None:
    with pytest.raises(ValueError, match="priority must be between -1000000 and 1000000"):
        manager.pending(jobs.Record(1)).priority(10**7)
    with pytest.raises(ValueError, match="tries must be between 1 and 1000000"):
        manager.pending(jobs.Record(1)).tries(10**7)

    @dataclass
    class Hoarder(Job):
        NAME = "tests.hoarder"
        PRIORITY = -(10**9)

    with pytest.raises(JobDefinitionError, match="Hoarder: PRIORITY must be between"):
        manager.dispatch(Hoarder())

    @dataclass
    class Nul(Job):
        NAME = "tests.nul"
        QUEUE = "mail\x00"

    with pytest.raises(JobDefinitionError, match="queue name 'mail\\\\x00' contains a NUL character"):
        manager.dispatch(Nul())
