"""A tiny application for the command-line tests, on the memory driver.

The memory driver lives in one process, so what a test needs queued is put
there when the CLI process boots the app, driven by environment variables:

- ``CLI_APP_OUT``: a file every job appends a line to (``<id> <event>``).
- ``CLI_APP_JOBS``: how many ``Touch`` jobs to dispatch at boot.
- ``CLI_APP_SLOW``: how many ``Slow`` jobs (they take ``CLI_APP_SLOW_SECONDS``).
- ``CLI_APP_BROKEN``: how many ``Broken`` jobs (they fail for good) to dispatch at boot.
- ``CLI_APP_FAILED``: how many jobs to put straight into the failed store.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager
from rainier_sync.drivers import MemoryQueue
from rainier_sync.errors import ConfigurationError, QueueUnavailableError
from rainier_sync.types import FailedJob, QueueCounts


def _record(line: str) -> None:
    with open(os.environ["CLI_APP_OUT"], "a", encoding="utf-8") as out:
        out.write(line + "\n")


@dataclass
class Touch(Job):
    NAME = "cli-tests.touch"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        _record(f"{self.n} ran")


@dataclass
class Slow(Job):
    NAME = "cli-tests.slow"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        _record(f"{self.n} started")
        # Ignores stop_requested on purpose: a graceful stop lets it finish.
        threading.Event().wait(float(os.environ.get("CLI_APP_SLOW_SECONDS", "0.5")))
        _record(f"{self.n} finished")


@dataclass
class Broken(Job):
    NAME = "cli-tests.broken"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(f"broken job {self.n}")


registry = JobRegistry().with_job(Touch).with_job(Slow).with_job(Broken)


def make_manager() -> QueueManager:
    """Factory for ``--app tests.cli.app:make_manager``."""
    driver = MemoryQueue(reservation=30)
    manager = QueueManager(connections={"main": driver}, registry=registry, container=Container())
    for n in range(int(os.environ.get("CLI_APP_JOBS", "0"))):
        manager.dispatch(Touch(n=n))
    for n in range(int(os.environ.get("CLI_APP_SLOW", "0"))):
        manager.dispatch(Slow(n=n))
    for n in range(int(os.environ.get("CLI_APP_BROKEN", "0"))):
        manager.dispatch(Broken(n=n))
    for n in range(int(os.environ.get("CLI_APP_FAILED", "0"))):
        manager.dispatch_on("mail", Broken(n=n))
        reserved = driver.reserve(["mail"])
        assert reserved is not None
        driver.fail(reserved, f"RuntimeError: broken job {n}")
    return manager


#: A manager built at import, for ``--app tests.cli.app:manager``.
manager = QueueManager(connections={"main": MemoryQueue()}, registry=registry, container=Container())

#: Not a manager, for the error tests.
not_a_manager = 42


def returns_wrong_type() -> object:
    return {"not": "a manager"}


def needs_an_argument(name: str) -> QueueManager:
    raise AssertionError("never called")


#: What ``current_manager`` returns: in-process tests put a fresh manager here.
current: QueueManager | None = None


def current_manager() -> QueueManager:
    """Factory for ``--app tests.cli.app:current_manager`` (in-process tests)."""
    assert current is not None, "the test sets tests.cli.app.current first"
    return current


def explodes() -> QueueManager:
    raise RuntimeError("could not reach the settings service")


class UnreachableQueue(MemoryQueue):
    """A backend that cannot be reached: every operation the commands use raises ``error``."""

    def __init__(self, error: type[Exception]) -> None:
        super().__init__()
        self.error = error

    def _down(self) -> Exception:
        return self.error("connection 'main' (memory): could not reach the server at 127.0.0.1:1")

    def counts(self, queue: str) -> QueueCounts:
        raise self._down()

    def failed_count(self) -> int:
        raise self._down()

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        raise self._down()

    def reclaim_expired(self) -> int:
        raise self._down()


class DownQueue(UnreachableQueue):
    """An :class:`UnreachableQueue` whose claims fail too."""

    def reserve_many(self, queues: Any, limit: int) -> list[Any]:
        raise self._down()


def down() -> QueueManager:
    """Factory for ``--app tests.cli.app:down``: every claim fails."""
    return QueueManager(connections={"main": DownQueue(ConnectionError)}, registry=registry)


class UnavailableAndMisconfigured(QueueUnavailableError, ConfigurationError):
    """An outage error that also passes for a configuration error, as a driver kept compatible might raise."""


def unreachable() -> QueueManager:
    """Factory for ``--app tests.cli.app:unreachable``: its backend raises QueueUnavailableError."""
    return QueueManager(connections={"main": UnreachableQueue(QueueUnavailableError)}, registry=registry)


def unreachable_compatible() -> QueueManager:
    """Factory whose backend raises an outage error that is also a ConfigurationError."""
    return QueueManager(connections={"main": UnreachableQueue(UnavailableAndMisconfigured)}, registry=registry)


def from_env() -> QueueManager:
    """Factory for ``--app tests.cli.app:from_env``: ``QUEUE_DRIVER`` and its settings, with this registry."""
    return QueueManager.from_env(registry=registry, container=Container())


def explodes_with_control_characters() -> QueueManager:
    raise RuntimeError("could not boot:\nforged: a line\x00")
