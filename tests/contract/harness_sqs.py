"""The contract suite against moto's SQS server, one fresh set of queues per driver."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from rainier_sync.drivers.sqs import SqsQueue
from tests.services.moto import REGION, sqs_client_for, unique_queue_name

from .harness import Harness

QUEUES = ("default", "other", "high", "low", "a", "b", "c")
RESERVATION = 2


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    endpoint: str = request.getfixturevalue("sqs_endpoint")
    client = sqs_client_for(endpoint)
    made: list[str] = []
    drivers: list[SqsQueue] = []

    def create(name: str) -> str:
        url: str = client.create_queue(QueueName=unique_queue_name(name))["QueueUrl"]
        made.append(url)
        return url

    def make() -> SqsQueue:
        urls: dict[str, Any] = {name: create(name) for name in QUEUES}
        driver = SqsQueue(
            urls.pop("default"),
            queue_urls=urls,
            failed_queue_url=create("failed"),
            endpoint=endpoint,
            region=REGION,
            key="testing",
            secret="testing",
            visibility_timeout=RESERVATION,
            wait_time=1,
        )
        drivers.append(driver)
        return driver

    try:
        yield Harness(
            name="sqs",
            make=make,
            reservation=RESERVATION,
            advance=time.sleep,
            delay=1.0,
            lacks={
                "order by priority": "SQS has no priority within a queue; put urgent jobs on their own queue "
                "and list it first in the worker's queues",
            },
        )
    finally:
        for url in made:
            try:
                client.delete_queue(QueueUrl=url)
            except Exception:  # noqa: BLE001 - moto going away first is fine
                pass
