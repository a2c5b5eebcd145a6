from __future__ import annotations

from typing import Iterator

import pytest

from rainier_sync import Container, JobRegistry, QueueManager, set_instance
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore

from . import jobs


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    jobs.calls.clear()
    jobs.Flaky.failed_calls.clear()
    jobs.Blocking.events.clear()
    jobs.Blocking.started.clear()
    previous = set_instance(None)
    yield
    for event in jobs.Blocking.events.values():
        event.set()
    set_instance(previous)


@pytest.fixture
def registry() -> JobRegistry:
    r = JobRegistry()
    for cls in (jobs.Record, jobs.Flaky, jobs.Unique, jobs.Blocking, jobs.Weird, jobs.BrokenFailed, jobs.WithList):
        r.register(cls)
    return r


@pytest.fixture
def memory() -> MemoryQueue:
    return MemoryQueue(reservation=30)


@pytest.fixture
def manager(registry: JobRegistry, memory: MemoryQueue) -> QueueManager:
    return QueueManager({"main": memory}, "main", registry, Container(), locks=MemoryLockStore())
