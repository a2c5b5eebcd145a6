"""Django configured for the tasks backend's tests, and a manager on each real
driver (memory, SQLite, PostgreSQL, Redis) made the process's instance."""

from __future__ import annotations

import importlib
import threading
import uuid
from types import ModuleType
from typing import Any, Iterator

import django
import pytest
from django.conf import settings
from django.test.utils import override_settings

import rainier_sync
from rainier_sync import QueueManager
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers.database import DatabaseQueue

if not settings.configured:
    settings.configure(USE_TZ=True, INSTALLED_APPS=[], DATABASES={})
    django.setup()

BACKEND = "rainier_sync.django.tasks.TasksBackend"
TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "mail"]}}
DRIVERS = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture
def tasks_settings() -> Iterator[dict[str, Any]]:
    """TASKS naming the backend, for one test."""
    with override_settings(TASKS=TASKS):
        yield TASKS


@pytest.fixture
def tasks(tasks_settings: dict[str, Any]) -> ModuleType:
    """The module of test tasks (its @task decorators need the TASKS above)."""
    module = importlib.import_module("tests.django_tasks.tasks")
    module.ATTEMPTS.clear()
    module.GATES.clear()
    module.RAN.clear()
    return module


def make_driver(kind: str, request: pytest.FixtureRequest) -> Any:
    if kind == "memory":
        return MemoryQueue(reservation=30)
    if kind == "sqlite":
        queue = DatabaseQueue.from_url(f"sqlite:///{request.getfixturevalue('tmp_path') / 'jobs.db'}", reservation=30)
        queue.migrate()
        return queue
    if kind == "postgres":
        from tests.drivers.database.support import postgres_schema_url

        queue = DatabaseQueue.from_url(postgres_schema_url(request), reservation=30)
        queue._backend.execute("TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks")
        return queue
    assert kind == "redis"
    from rainier_sync.drivers import RedisQueue

    url = request.getfixturevalue("redis_url")
    prefix = f"rstasks:{uuid.uuid4().hex[:12]}:queue:"
    queue = RedisQueue.from_url(url, prefix=prefix, reservation=30)

    def clean() -> None:
        client = queue.client
        for key in list(client.scan_iter(match=prefix.removesuffix("queue:") + "*", count=1000)):
            client.delete(key)

    request.addfinalizer(clean)
    return queue


@pytest.fixture(params=DRIVERS)
def manager(request: pytest.FixtureRequest, tasks: ModuleType) -> Iterator[QueueManager]:
    """A manager on one real driver, with the lock store of that driver's backend, set as the instance."""
    made = QueueManager(connections={request.param: make_driver(request.param, request)})
    previous = rainier_sync.set_instance(made)
    try:
        yield made
    finally:
        rainier_sync.set_instance(previous)
        made.close()


class Heard:
    """The task signals sent while it listens, and a bounded wait for them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any, Any]] = []
        self._changed = threading.Condition()

    def hear(self, name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            with self._changed:
                self.events.append((name, sender, task_result))
                self._changed.notify_all()

        return receiver

    def of(self, name: str, task_id: str | None = None) -> list[Any]:
        with self._changed:
            return [r for n, _, r in self.events if n == name and (task_id is None or r.id == task_id)]

    def wait(self, name: str, task_id: str, timeout: float = 60.0) -> Any:
        with self._changed:
            ok = self._changed.wait_for(lambda: any(n == name and r.id == task_id for n, _, r in self.events), timeout)
        assert ok, f"no {name} for task {task_id} within {timeout}s: heard {self.events}"
        return self.of(name, task_id)[-1]


@pytest.fixture
def heard() -> Iterator[Heard]:
    from rainier_sync.django.tasks import task_enqueued, task_finished, task_started

    listening = Heard()
    receivers = {name: listening.hear(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"], weak=False)
    task_started.connect(receivers["started"], weak=False)
    task_finished.connect(receivers["finished"], weak=False)
    yield listening
    task_enqueued.disconnect(receivers["enqueued"])
    task_started.disconnect(receivers["started"])
    task_finished.disconnect(receivers["finished"])
