from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest

from rainier_sync.locks import MemoryLockStore

from .harness import Harness


def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    brokers: str = request.getfixturevalue("kafka_brokers")
    from rainier_sync.drivers.kafka import KafkaQueue
    from tests.services.tansu import FAST_GROUP

    def make() -> KafkaQueue:
        tag = uuid.uuid4().hex[:10]
        return KafkaQueue(
            brokers,
            group=f"contract-{tag}",
            topic_prefix=f"contract-{tag}.",
            lease=2,
            locks=MemoryLockStore(),
            # tansu reports a wrong high watermark after a multi-record batch;
            # one record per batch keeps size() right (see docs/drivers/kafka.rst).
            producer_config={"batch.num.messages": 1},
            consumer_config=FAST_GROUP,
        )

    # The broker keeps its own time and the lock store's leases are real
    # seconds, so the clock only moves by sleeping: delays stay short.
    yield Harness(
        name="kafka",
        make=make,
        reservation=2,
        advance=time.sleep,
        delay=2.5,
        lacks={
            "order by priority": "a partition is a log: jobs run in the order they were written, "
            "whatever their priority",
            "tell reserved jobs from ready ones": "a partition's lag counts the jobs not yet committed, "
            "running or not",
            "try queues strictly in the order given": "a consumer orders by queue only what it has fetched: "
            "a later queue's records fetched before an earlier queue's arrive can go first",
        },
    )
