from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from rainier_sync import QueueManager
from rainier_sync.drivers.sqs import SqsQueue
from tests.services.moto import REGION, sqs_client_for, unique_queue_name

from . import jobs


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    with jobs.lock:
        jobs.runs.clear()


class Queues:
    """Creates uniquely named queues on one endpoint and deletes them afterwards."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.client = sqs_client_for(endpoint)
        self.urls: list[str] = []

    def create(self, name: str = "q", *, fifo: bool = False, **attributes: str) -> str:
        if fifo:
            attributes.setdefault("FifoQueue", "true")
        url: str = self.client.create_queue(QueueName=unique_queue_name(name, fifo), Attributes=attributes)["QueueUrl"]
        self.urls.append(url)
        return url

    def driver(self, *, queues: tuple[str, ...] = (), fifo: bool = False, **options: Any) -> SqsQueue:
        options.setdefault("visibility_timeout", 2)
        options.setdefault("wait_time", 1)
        return SqsQueue(
            self.create("default", fifo=fifo),
            queue_urls={name: self.create(name) for name in queues},
            failed_queue_url=self.create("failed"),
            endpoint=self.endpoint,
            region=REGION,
            key="testing",
            secret="testing",
            **options,
        )

    def cleanup(self) -> None:
        for url in self.urls:
            try:
                self.client.delete_queue(QueueUrl=url)
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass


@pytest.fixture
def queues(sqs_endpoint: str) -> Iterator[Queues]:
    made = Queues(sqs_endpoint)
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def manager_for() -> Iterator[Callable[[SqsQueue], QueueManager]]:
    managers: list[QueueManager] = []

    def build(driver: SqsQueue, **kwargs: Any) -> QueueManager:
        manager = QueueManager({"sqs": driver}, registry=jobs.registry(), **kwargs)
        managers.append(manager)
        return manager

    yield build
    for manager in managers:
        manager.close()


def count_calls(*clients: Any) -> dict[str, int]:
    """Counts API calls made through ``clients`` by operation name."""
    counts: dict[str, int] = {}

    def on_call(model: Any, **_: Any) -> None:
        counts[model.name] = counts.get(model.name, 0) + 1

    for client in clients:
        client.meta.events.register("before-call.sqs", on_call)
    return counts
