"""An embedded worker started before its backend answers: it reports the outage
and tries again until the backend comes up, then works; a backend that answers
and refuses the configuration ends the run at once."""

from __future__ import annotations

import logging
import pathlib
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager
from rainier_sync.errors import ConfigurationError, QueueUnavailableError
from rainier_sync.worker import Worker, WorkerOptions
from tests.cli.late import Forwarder, redis_server
from tests.support import free_port, wait_until

#: Set by the job when it runs.
ran: dict[str, threading.Event] = {}


@dataclass
class Mark(Job):
    NAME = "startup-tests.mark"

    key: str = ""

    def handle(self, context: JobContext) -> None:
        ran.setdefault(self.key, threading.Event()).set()


registry = JobRegistry().with_job(Mark)


def _started_and_failing(worker: Worker) -> None:
    wait_until(lambda: worker.health().failing_since is not None, 60, message="the worker to meet the outage")
    health = worker.health()
    assert health.last_error.startswith("start: "), health
    assert not worker.stopping


def _finish(worker: Worker, key: str) -> None:
    assert ran.setdefault(key, threading.Event()).wait(60), f"the job never ran: {worker.health()}"
    worker.stop()
    stats = worker.join(60)
    assert worker._thread is not None and not worker._thread.is_alive()
    assert stats.processed == 1 and stats.failed == 0
    assert worker.health().failing_since is None


def test_an_embedded_worker_waits_for_redis_to_come_up_then_works(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    from rainier_sync.drivers.redis import RedisQueue

    port = free_port()
    manager = QueueManager({"main": RedisQueue.from_url(f"redis://127.0.0.1:{port}/0")}, "main", registry, Container())
    worker = Worker(manager, options=WorkerOptions(sleep=0.2, concurrency=1))
    server = None
    worker.start()
    try:
        _started_and_failing(worker)
        server = redis_server(tmp_path / "redis", port)
        manager.dispatch(Mark("redis"))
        _finish(worker, "redis")
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()
        if server is not None:
            server.stop()


@pytest.fixture
def postgres(request: pytest.FixtureRequest) -> Iterator[str]:
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    from tests.drivers.database.support import postgres_schema_url

    yield postgres_schema_url(request)


def test_an_embedded_worker_waits_for_postgres_lost_before_it_started(postgres: str) -> None:
    from rainier_sync.drivers.database import DatabaseQueue

    real = urllib.parse.urlsplit(postgres)
    upstream = (real.hostname or "127.0.0.1", real.port or 5432)
    port = free_port()
    forwarder = Forwarder(port, upstream)
    via = urllib.parse.urlunsplit(real._replace(netloc=f"{real.username or 'postgres'}@127.0.0.1:{port}"))
    # Built while the server answers through the forwarder; then the server is gone when the worker starts.
    driver = DatabaseQueue.from_url(via, reconnect_for=0.5)
    manager = QueueManager({"main": driver}, "main", registry, Container())
    forwarder.close()
    worker = Worker(manager, options=WorkerOptions(sleep=0.2, concurrency=1, queues=["startup-embedded"]))
    direct = QueueManager({"main": DatabaseQueue.from_url(postgres)}, "main", registry, Container())
    worker.start()
    try:
        _started_and_failing(worker)
        direct.dispatch_on("startup-embedded", Mark("postgres"))
        forwarder = Forwarder(port, upstream)
        _finish(worker, "postgres")
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()
        direct.close()
        forwarder.close()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{port}/99", "redis://:not-the-password@127.0.0.1:{port}/0"],
                         ids=["db-index-out-of-range", "auth-refused"])  # fmt: skip
@pytest.mark.parametrize("once", [True, False], ids=["once", "resident"])
def test_redis_refusing_the_configuration_ends_the_run_at_once(url: str, once: bool, redis_url: str) -> None:
    from rainier_sync.drivers.redis import RedisQueue

    port = urllib.parse.urlsplit(redis_url).port or 6379
    manager = QueueManager({"main": RedisQueue.from_url(url.format(port=port))}, "main", registry, Container())
    worker = Worker(manager, options=WorkerOptions(once=once, give_up=120, sleep=0.2))
    raised: list[BaseException] = []

    def run() -> Any:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            raised.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(60)
    try:
        assert not runner.is_alive(), f"still retrying: {worker.health()}"
        assert len(raised) == 1 and isinstance(raised[0], ConfigurationError), raised
        assert "127.0.0.1" in str(raised[0])
    finally:
        worker.stop(0)
        runner.join(10)
        manager.close()


def test_an_embedded_worker_waits_for_sqs_to_come_up_then_works(_aws_fake_env: None) -> None:
    pytest.importorskip("boto3", reason="the sqs extra is not installed")
    pytest.importorskip("moto.server", reason="moto's server is not installed")
    from rainier_sync.drivers.sqs import SqsQueue
    from tests.services.moto import REGION, MotoServer, sqs_client_for

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    names = {name: f"startup-{name}-{port}" for name in ("default", "failed")}
    urls = {name: f"{endpoint}/123456789012/{queue}" for name, queue in names.items()}
    driver = SqsQueue(urls["default"], failed_queue_url=urls["failed"], endpoint=endpoint, region=REGION,
                      key="testing", secret="testing", wait_time=1, visibility_timeout=5, timeout=1)  # fmt: skip
    manager = QueueManager({"main": driver}, "main", registry, Container())
    worker = Worker(manager, options=WorkerOptions(sleep=0.2, concurrency=1))
    server = MotoServer(port)
    worker.start()
    try:
        # SQS has nothing to sweep: the first claim is what meets the outage.
        wait_until(lambda: worker.health().failing_since is not None, 60, message="the worker to meet the outage")
        server.start()
        client = sqs_client_for(endpoint)
        for queue in names.values():
            assert client.create_queue(QueueName=queue)["QueueUrl"].endswith(queue)
        manager.dispatch(Mark("sqs"))
        _finish(worker, "sqs")
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()
        server.stop()


def test_an_embedded_worker_waits_for_kafka_to_come_up_then_works(tmp_path: pathlib.Path, redis_url: str) -> None:
    pytest.importorskip("confluent_kafka", reason="the kafka extra is not installed")
    from rainier_sync.drivers.kafka import KafkaQueue
    from rainier_sync.locks import RedisLockStore
    from tests.services.tansu import Tansu, _binary_or_missing

    tag = uuid.uuid4().hex[:10]
    locks = RedisLockStore.from_url(redis_url, prefix=f"rainier-test:startup:{tag}:")
    port = free_port()
    driver = KafkaQueue(f"127.0.0.1:{port}", group=f"t-{tag}", topic_prefix=f"t-{tag}.", locks=locks, timeout=2)
    manager = QueueManager({"main": driver}, "main", registry, Container())
    worker = Worker(manager, options=WorkerOptions(sleep=0.2, concurrency=1))
    broker = Tansu(_binary_or_missing(), tmp_path)
    worker.start()
    try:
        # Kafka has nothing to sweep: the first claim is what meets the outage.
        wait_until(lambda: worker.health().failing_since is not None, 60, message="the worker to meet the outage")
        broker.start(port)
        manager.dispatch(Mark("kafka"))
        _finish(worker, "kafka")
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()
        broker.stop()
        locks.close()


@pytest.mark.parametrize("kind", ["sqs", "kafka"])
def test_a_once_run_on_a_port_nothing_listens_on_gives_up_after_give_up(
    kind: str, request: pytest.FixtureRequest
) -> None:
    port = free_port()
    if kind == "sqs":
        pytest.importorskip("boto3", reason="the sqs extra is not installed")
        request.getfixturevalue("_aws_fake_env")
        from rainier_sync.drivers.sqs import SqsQueue

        endpoint = f"http://127.0.0.1:{port}"
        driver: Any = SqsQueue(
            f"{endpoint}/123456789012/default", failed_queue_url=f"{endpoint}/123456789012/failed",
            endpoint=endpoint, region="us-east-1", key="testing", secret="testing", timeout=1,
        )  # fmt: skip
    else:
        pytest.importorskip("confluent_kafka", reason="the kafka extra is not installed")
        from rainier_sync.drivers.kafka import KafkaQueue
        from rainier_sync.locks import MemoryLockStore

        driver = KafkaQueue(f"127.0.0.1:{port}", group=f"t-{uuid.uuid4().hex[:10]}", locks=MemoryLockStore(), timeout=1)
    manager = QueueManager({"main": driver}, "main", registry, Container())
    began = time.monotonic()
    try:
        with pytest.raises(QueueUnavailableError, match="has not answered since the worker started") as raised:
            Worker(manager, options=WorkerOptions(once=True, give_up=3)).run()
    finally:
        manager.close()
    assert time.monotonic() - began >= 2, "gave up without waiting"
    assert f"127.0.0.1:{port}" in str(raised.value)


def _closed_redis_worker(**options: Any) -> tuple[QueueManager, Worker]:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    from rainier_sync.drivers.redis import RedisQueue

    manager = QueueManager({"main": RedisQueue.from_url(f"redis://127.0.0.1:{free_port()}/0")}, "main", registry,
                           Container())  # fmt: skip
    return manager, Worker(manager, options=WorkerOptions(sleep=0.2, concurrency=1, **options))


def test_stop_ends_the_wait_for_a_backend_that_never_comes_up() -> None:
    manager, worker = _closed_redis_worker()
    worker.start()
    try:
        _started_and_failing(worker)
        worker.stop()
        worker.join(30)
        assert worker._thread is not None and not worker._thread.is_alive()
        assert worker.stats.processed == 0
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()


def test_the_health_file_is_touched_while_the_worker_waits_for_its_backend(tmp_path: pathlib.Path) -> None:
    import os

    path = tmp_path / "alive"
    manager, worker = _closed_redis_worker(health_file=str(path))
    worker.start()
    try:
        _started_and_failing(worker)
        wait_until(path.exists, 30, message="the health file")
        first = os.stat(path).st_mtime_ns
        wait_until(lambda: os.stat(path).st_mtime_ns > first, 30, message="the health file to be touched again")
        assert worker.health().failing_since is not None, "still waiting for the backend"
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()


def test_a_redis_that_may_evict_jobs_is_warned_of_once_it_answers(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    redis = pytest.importorskip("redis", reason="the redis extra is not installed")
    from rainier_sync.drivers.redis import RedisQueue

    port = free_port()
    server = redis_server(tmp_path / "redis", port)
    try:
        redis.Redis(host="127.0.0.1", port=port).config_set("maxmemory-policy", "allkeys-lru")
        manager = QueueManager({"main": RedisQueue.from_url(f"redis://127.0.0.1:{port}/0")}, "main", registry,
                               Container())  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="rainier_sync"):
            Worker(manager, options=WorkerOptions(once=True)).run()
        manager.close()
    finally:
        server.stop()
    assert any("maxmemory-policy is 'allkeys-lru'" in r.getMessage() for r in caplog.records), caplog.text


def test_a_worker_waiting_for_its_backend_is_not_listed_until_it_answers() -> None:
    """Its store answers (memory), its queue does not: it is recorded once it can work."""
    pytest.importorskip("redis", reason="the redis extra is not installed")
    from rainier_sync.drivers.redis import RedisQueue
    from rainier_sync.locks import MemoryLockStore

    locks = MemoryLockStore()
    queue = RedisQueue.from_url(f"redis://127.0.0.1:{free_port()}/0")
    manager = QueueManager({"main": queue}, "main", registry, Container(), locks=locks)
    worker = Worker(manager, options=WorkerOptions(sleep=0.2, concurrency=1))
    worker.start()
    try:
        _started_and_failing(worker)
        wait_until(lambda: worker.health().last_turn_age is not None, 30, message="the loop to turn")
        assert manager.workers() == [], "not working yet, so not listed"
    finally:
        worker.stop(0)
        worker.join(30)
        manager.close()
    assert manager.workers() == [], "it never recorded itself, so it has nothing to remove"
