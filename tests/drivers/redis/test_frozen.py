"""The Redis driver's waits are bounded by default: a real Redis stopped with
SIGSTOP (it accepts connections and never answers) and a host that never
completes a connection end each operation in RedisUnavailableError, whichever
form declared the connection; an idle worker's blocking reads on a healthy
server are not taken for an outage. A database index the server does not have
is a configuration error, not an outage."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rainier_sync import QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.redis import RedisUnavailableError
from rainier_sync.errors import ConfigurationError
from rainier_sync.locks import RedisLockStore
from tests.support import wait_until

from . import jobs
from .frozen import frozen_redis, silent_host

pytestmark = pytest.mark.redis

#: What the driver documents as its defaults (docs/drivers/redis.rst), in seconds.
CONNECT_TIMEOUT = 5.0
RESPONSE_TIMEOUT = 5.0
#: The longest an idle blocking read (XREADGROUP BLOCK, the lock store's BLPOP) blocks.
LONGEST_BLOCK = 1.0
#: Far above any bound here: an operation still running then hangs.
HANG = 60.0


@pytest.fixture
def frozen_url(tmp_path: Path) -> Iterator[str]:
    with frozen_redis(tmp_path) as url:
        yield url


def timeouts(client: Any) -> tuple[float | None, float | None]:
    kwargs = client.connection_pool.connection_kwargs
    return kwargs["socket_connect_timeout"], kwargs["socket_timeout"]


def bounded(*calls: Callable[[], object]) -> list[BaseException | None]:
    """Run ``calls`` at once, each in a thread of its own; what each raised (None
    if it returned). One still running after HANG seconds fails the test (its
    thread, a daemon, is left behind)."""
    outcomes: list[BaseException | None] = [None] * len(calls)
    done = [threading.Event() for _ in calls]

    def run(index: int) -> None:
        try:
            calls[index]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcomes[index] = exc
        finally:
            done[index].set()

    for index in range(len(calls)):
        threading.Thread(target=run, args=(index,), daemon=True).start()
    for index, event in enumerate(done):
        assert event.wait(HANG), f"operation {index} still waits after {HANG:g} s"
    return outcomes


# -- the defaults -------------------------------------------------------------------------


def test_connect_and_response_waits_are_bounded_by_default(redis_url: str) -> None:
    queue = RedisQueue.from_url(redis_url)
    store = RedisLockStore.from_url(redis_url)
    try:
        assert timeouts(queue.client) == (CONNECT_TIMEOUT, RESPONSE_TIMEOUT)
        assert timeouts(store._client) == (CONNECT_TIMEOUT, RESPONSE_TIMEOUT)
        assert RESPONSE_TIMEOUT > LONGEST_BLOCK, "an idle blocking read must never be cut off as an outage"
    finally:
        queue.close()
        store.close()


def test_a_frozen_redis_ends_each_operation_of_a_default_connection(frozen_url: str) -> None:
    queue = RedisQueue.from_url(frozen_url, prefix="frozen:")
    store = RedisLockStore.from_url(frozen_url)
    try:
        errors = bounded(
            lambda: queue.push(jobs_queued()),
            lambda: queue.counts("default"),
            lambda: queue.reserve_many(["default"], 1),
            lambda: store.acquire("frozen", "me", 30),
        )
    finally:
        bounded(queue.close, store.close)
    port = frozen_url.rsplit(":", 1)[1].split("/")[0]
    for error in errors:
        assert isinstance(error, RedisUnavailableError), error
        message = str(error)
        assert f"127.0.0.1:{port}" in message and "Timeout" in message, message
        assert "no reply within 5000 ms (response_timeout_ms)" in message, message


def test_a_host_that_never_completes_a_connection_ends_it_within_the_default_connect_timeout() -> None:
    with silent_host() as url:
        queue = RedisQueue.from_url(url)
        try:
            (error,) = bounded(lambda: queue.counts("default"))
        finally:
            queue.close()
    assert isinstance(error, RedisUnavailableError), error
    assert "no connection within 5000 ms (connect_timeout_ms)" in str(error), error


def test_a_declared_response_timeout_is_the_one_a_frozen_redis_meets(frozen_url: str) -> None:
    environ = {"QUEUE_DRIVER": "redis", "REDIS_URL": frozen_url, "REDIS_RESPONSE_TIMEOUT_MS": "300"}
    manager = QueueManager.from_env(registry=jobs.registry(), environ=environ)
    try:
        (error,) = bounded(lambda: manager.connection().counts("default"))
    finally:
        bounded(manager.close)
    assert isinstance(error, RedisUnavailableError), error
    assert "no reply within 300 ms (response_timeout_ms)" in str(error), error


# -- every form of configuration declares them ---------------------------------------------


def _section(url: str) -> dict[str, Any]:
    return {"connections": {"fast": {"driver": "redis", "url": url, "connect_timeout_ms": 1500,
                                     "response_timeout_ms": 2500}}}  # fmt: skip


def _from_env(url: str) -> QueueManager:
    environ = {"QUEUE_DRIVER": "redis", "REDIS_URL": url, "REDIS_CONNECT_TIMEOUT_MS": "1500",
               "REDIS_RESPONSE_TIMEOUT_MS": "2500"}  # fmt: skip
    return QueueManager.from_env(registry=jobs.registry(), environ=environ)


def _from_section(url: str) -> QueueManager:
    return QueueManager.from_config(_section(url), registry=jobs.registry(), environ={})


def _from_flask_config(url: str) -> QueueManager:
    flask = pytest.importorskip("flask", reason="the flask extra is not installed")
    from rainier_sync.flask import RainierSync

    app = flask.Flask("redis_timeouts")
    app.config.update(
        QUEUE_DRIVER="redis", REDIS_URL=url, REDIS_CONNECT_TIMEOUT_MS=1500, REDIS_RESPONSE_TIMEOUT_MS=2500
    )
    return RainierSync.boot(app.config, registry=jobs.registry())


def _from_flask_section(url: str) -> QueueManager:
    flask = pytest.importorskip("flask", reason="the flask extra is not installed")
    from rainier_sync.flask import RainierSync

    app = flask.Flask("redis_timeouts_section")
    app.config["RAINIER_QUEUES"] = _section(url)
    return RainierSync.boot(app.config, registry=jobs.registry())


@pytest.mark.parametrize("boot", [_from_env, _from_section, _from_flask_config, _from_flask_section],
                         ids=["environment", "section", "flask app.config", "flask RAINIER_QUEUES"])  # fmt: skip
def test_every_form_of_configuration_declares_the_timeouts(redis_url: str, boot: Callable[[str], QueueManager]) -> None:
    manager = boot(redis_url)
    try:
        driver: Any = manager.connection()
        assert timeouts(driver.client) == (1.5, 2.5)
        assert driver.counts("default").total >= 0  # and the connection works with them
    finally:
        manager.close()


@pytest.mark.parametrize(
    ("variable", "written", "why"),
    [
        ("REDIS_CONNECT_TIMEOUT_MS", "fast", "whole milliseconds"),
        ("REDIS_RESPONSE_TIMEOUT_MS", "2.5", "whole milliseconds"),
        ("REDIS_RESPONSE_TIMEOUT_MS", "0", "at least 1"),
    ],
)
def test_a_bad_timeout_in_the_environment_is_refused_naming_the_variable(
    redis_url: str, variable: str, written: str, why: str
) -> None:
    environ = {"QUEUE_DRIVER": "redis", "REDIS_URL": redis_url, variable: written}
    with pytest.raises(ConfigurationError, match=f"QUEUE_DRIVER=redis: {variable} .*{why}"):
        QueueManager.from_env(registry=jobs.registry(), environ=environ)


# -- idle is not an outage ------------------------------------------------------------------


@pytest.mark.parametrize("response_timeout_ms", [None, 250], ids=["default", "250ms"])
def test_a_worker_idle_for_longer_than_the_response_timeout_stays_healthy(
    redis_url: str, redis_client: redis.Redis, prefix: str, response_timeout_ms: int | None
) -> None:
    failed: list[dict[str, Any]] = []

    def on_failed(sender: object, **kwargs: Any) -> None:
        failed.append(kwargs)

    driver = RedisQueue.from_url(redis_url, prefix=prefix, response_timeout_ms=response_timeout_ms)
    response_timeout = RESPONSE_TIMEOUT if response_timeout_ms is None else response_timeout_ms / 1000
    assert timeouts(driver.client)[1] == response_timeout
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(redis_url))
    manager.dispatch(jobs.Record(prefix, 1))  # the queue has a stream, so the idle worker blocks reading it
    # an idle wait itself longer than the response timeout too
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=1, sleep=response_timeout * 2))
    signals.queue_operation_failed.connect(on_failed)
    worker.start()
    try:
        wait_until(lambda: redis_client.hget(prefix + "ran", "1") == b"1", 30, message="the first job to run")
        idle_from = time.monotonic()
        consumer = f"rainier-queue-{driver.consumer}"

        def blocked_reading() -> bool:
            clients = redis_client.client_list()
            return any(c["name"] == consumer and "b" in c["flags"] and c["cmd"] == "xreadgroup" for c in clients)

        # idle through more than one response timeout, and blocked in its read at the end of it
        wait_until(
            lambda: time.monotonic() - idle_from > response_timeout + 2 * LONGEST_BLOCK and blocked_reading(),
            30,
            0.05,
            "the worker to stay idle past the response timeout",
        )
        assert failed == [], failed
        assert worker.stats.processed == 1
        manager.dispatch(jobs.Record(prefix, 2))
        wait_until(lambda: redis_client.hget(prefix + "ran", "2") == b"1", 30, message="the next job to run")
        assert failed == [], failed
    finally:
        signals.queue_operation_failed.disconnect(on_failed)
        worker.stop()
        worker.join(30)
        manager.close()


def test_a_lock_store_wait_longer_than_its_blocks_is_not_an_outage(redis_url: str, prefix: str) -> None:
    store = RedisLockStore.from_url(redis_url, prefix=prefix)  # the default timeouts
    try:
        key = uuid.uuid4().hex
        putter = threading.Timer(3 * LONGEST_BLOCK, lambda: store.put_value(key, "done", 60))
        putter.start()
        try:
            assert store.wait_value(key, HANG, lambda value: value is not None) == "done"
        finally:
            putter.cancel()
    finally:
        store.close()


def test_a_lock_store_with_a_short_response_timeout_waits_in_blocks_inside_it(redis_url: str, prefix: str) -> None:
    """A declared 600 ms response timeout: the wait blocks in pieces of a quarter of it, so it
    is never taken for a frozen server."""
    store = RedisLockStore.from_url(redis_url, prefix=prefix, response_timeout_ms=600)
    try:
        key = uuid.uuid4().hex
        putter = threading.Timer(1.5, lambda: store.put_value(key, "done", 60))
        putter.start()
        try:
            assert store.wait_value(key, HANG, lambda value: value is not None) == "done"
        finally:
            putter.cancel()
    finally:
        store.close()


# -- a database index the server does not have ---------------------------------------------


def _missing_index(redis_client: redis.Redis, redis_url: str) -> tuple[str, int]:
    databases = int(redis_client.config_get("databases")["databases"])
    return redis_url.rsplit("/", 1)[0] + f"/{databases}", databases


@pytest.mark.parametrize("reconnect", [False, True], ids=["plain", "reconnect"])
def test_a_database_index_the_server_lacks_is_a_configuration_error_naming_it(
    redis_client: redis.Redis, redis_url: str, reconnect: bool
) -> None:
    url, index = _missing_index(redis_client, redis_url)
    queue = RedisQueue.from_url(url, reconnect=reconnect)
    store = RedisLockStore.from_url(url, reconnect=reconnect)
    try:
        for operation in (
            lambda: queue.push(jobs_queued()),
            lambda: queue.counts("default"),
            queue.check_eviction_policy,
            lambda: store.acquire("key", "me", 30),
        ):
            with pytest.raises(ConfigurationError) as caught:
                operation()
            assert not isinstance(caught.value, RedisUnavailableError)
            message = str(caught.value)
            assert f"database index {index}" in message and "DB index is out of range" in message, message
    finally:
        queue.close()
        store.close()


def jobs_queued() -> Any:
    from .test_driver import job

    return job()
