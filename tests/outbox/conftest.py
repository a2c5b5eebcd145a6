"""Fixtures of the outbox tests: an outbox in each database (the one the
caller's transaction is on), and each driver it relays to, on its real server."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from rainier_sync.drivers.base import BaseQueue
from rainier_sync.outbox import Outbox
from rainier_sync.types import QueuedJob
from tests.drivers.database.support import emptied, mysql_database_url, postgres_schema_url

#: The SQLAlchemy URL of each dialect, for the DBAPI drivers the queue writes with.
_SQLALCHEMY = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}


def sqlalchemy_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{_SQLALCHEMY[scheme]}://{rest}"


@pytest.fixture
def sqlite_outbox_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    Outbox.from_url(url).migrate()
    return url


@pytest.fixture
def pg_outbox_url(request: pytest.FixtureRequest) -> str:
    return emptied(postgres_schema_url(request), "rainier_outbox", "rainier_locks")


@pytest.fixture
def my_outbox_url(request: pytest.FixtureRequest) -> str:
    return emptied(mysql_database_url(request), "rainier_outbox", "rainier_locks")


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def outbox_url(request: pytest.FixtureRequest) -> str:
    """A migrated, empty outbox in a database of each dialect."""
    name = {"sqlite": "sqlite_outbox_url", "postgresql": "pg_outbox_url", "mysql": "my_outbox_url"}[request.param]
    return str(request.getfixturevalue(name))


def make_redis(url: str) -> Any:
    from rainier_sync.drivers import RedisQueue

    return RedisQueue.from_url(url, prefix=f"rsoutbox:{uuid.uuid4().hex[:12]}:")


def clean_redis(driver: Any) -> None:
    client = driver.client
    keys = list(client.scan_iter(match=driver.prefix + "*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def redis_target(redis_url: str) -> Iterator[BaseQueue]:
    driver = make_redis(redis_url)
    yield driver
    clean_redis(driver)
    driver.close()


@pytest.fixture
def sqs_target(sqs_endpoint: str) -> Iterator[BaseQueue]:
    from rainier_sync.drivers.sqs import SqsQueue
    from tests.services.moto import REGION, sqs_client_for, unique_queue_name

    client = sqs_client_for(endpoint=sqs_endpoint)
    urls = [client.create_queue(QueueName=unique_queue_name(name))["QueueUrl"] for name in ("default", "failed")]
    driver = SqsQueue(
        urls[0], failed_queue_url=urls[1], endpoint=sqs_endpoint, region=REGION, key="testing", secret="testing",
        visibility_timeout=30, wait_time=1,
    )  # fmt: skip
    yield driver
    driver.close()
    for url in urls:
        client.delete_queue(QueueUrl=url)


@pytest.fixture
def kafka_target(kafka_brokers: str) -> Iterator[BaseQueue]:
    from rainier_sync.drivers.kafka import KafkaQueue
    from rainier_sync.locks import MemoryLockStore
    from tests.services.tansu import FAST_GROUP

    tag = uuid.uuid4().hex[:10]
    driver = KafkaQueue(
        kafka_brokers, group=f"outbox-{tag}", topic_prefix=f"outbox-{tag}.", lease=30, locks=MemoryLockStore(),
        producer_config={"batch.num.messages": 1}, consumer_config=FAST_GROUP,
    )  # fmt: skip
    yield driver
    driver.close()


@pytest.fixture(params=["redis", "sqs", "kafka"])
def target(request: pytest.FixtureRequest) -> BaseQueue:
    """A connection that cannot write in the caller's transaction, on its real server."""
    return request.getfixturevalue(f"{request.param}_target")  # type: ignore[no-any-return]


def take(driver: BaseQueue, expected: int, *, queues: tuple[str, ...] = ("default",), timeout: float = 20.0) -> list[
    QueuedJob
]:
    """Reserve (and acknowledge) until ``expected`` jobs came, then make sure no
    more come: a consumer group (Kafka) may hand nothing out for a while after it joins."""
    taken: list[QueuedJob] = []
    deadline = time.monotonic() + timeout
    while len(taken) < expected and time.monotonic() < deadline:
        got = driver.reserve_many(list(queues), 100)
        for job in got:
            driver.acknowledge(job)
        taken.extend(got)
        if not got:
            time.sleep(0.05)
    assert len(taken) >= expected, f"only {len(taken)} of {expected} jobs reached {driver.describe()}"
    settle = time.monotonic() + (1.0 if driver.kind == "kafka" else 0.2)
    while time.monotonic() < settle:
        extra = driver.reserve_many(list(queues), 100)
        assert not extra, f"{len(extra)} job(s) more than the {expected} committed reached {driver.describe()}"
        time.sleep(0.05)
    return taken


def relay_all(relay: Any, timeout: float = 20.0, until: Callable[[], bool] | None = None) -> int:
    """``run_once`` until the outbox is empty (or ``until``)."""
    done = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done += relay.run_once()
        if (until or (lambda: relay.outbox.size() == 0))():
            return done
        time.sleep(0.05)
    raise AssertionError("the outbox was not relayed in time")
