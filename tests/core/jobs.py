"""Job classes shared by the core tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rainier_sync import Job, JobContext, backoff

calls: list[tuple[str, Any]] = []


@dataclass
class Record(Job):
    NAME = "tests.record"

    value: Any = None

    def handle(self, context: JobContext) -> None:
        calls.append(("record", self.value))


@dataclass
class Flaky(Job):
    """Fails until its attempt reaches ``succeed_on`` (0: never)."""

    NAME = "tests.flaky"
    TRIES = 3
    BACKOFF = backoff.fixed(5)

    succeed_on: int = 0
    failed_calls: ClassVar[list[tuple[str, str]]] = []

    def handle(self, context: JobContext) -> None:
        calls.append(("flaky", context.attempt))
        if self.succeed_on == 0 or context.attempt < self.succeed_on:
            try:
                raise OSError("upstream down")
            except OSError as exc:
                raise RuntimeError(f"attempt {context.attempt} failed") from exc

    def failed(self, context: JobContext, error: BaseException) -> None:
        Flaky.failed_calls.append((context.id, str(error)))


@dataclass
class Unique(Job):
    NAME = "tests.unique"
    TRIES = 2
    BACKOFF = backoff.none

    key: str = "k"
    fail: bool = False

    def handle(self, context: JobContext) -> None:
        calls.append(("unique", self.key))
        if self.fail:
            raise ValueError("unique job failed")

    def unique_id(self) -> str | None:
        return self.key


@dataclass
class Blocking(Job):
    """Waits on a named event so a test controls when it finishes."""

    NAME = "tests.blocking"

    event: str = "go"
    events: ClassVar[dict[str, threading.Event]] = {}
    started: ClassVar[dict[str, threading.Event]] = {}

    def handle(self, context: JobContext) -> None:
        Blocking.started.setdefault(self.event, threading.Event()).set()
        assert Blocking.events.setdefault(self.event, threading.Event()).wait(10), "test never released the job"


@dataclass
class Weird(Job):
    """Raises a BaseException that is neither KeyboardInterrupt nor SystemExit."""

    NAME = "tests.weird"

    def handle(self, context: JobContext) -> None:
        raise GeneratorExit("odd but survivable")


@dataclass
class BrokenFailed(Job):
    NAME = "tests.broken-failed"

    def handle(self, context: JobContext) -> None:
        raise ValueError("first")

    def failed(self, context: JobContext, error: BaseException) -> None:
        raise RuntimeError("failed() itself broke")


@dataclass
class WithList(Job):
    NAME = "tests.with-list"

    items: list[int] = field(default_factory=list)

    def handle(self, context: JobContext) -> None:
        calls.append(("with-list", list(self.items)))
