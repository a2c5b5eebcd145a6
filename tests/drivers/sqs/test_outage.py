"""An endpoint that is down or does not answer: every operation raises
QueueUnavailableError naming the connection, within a bounded time."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, Iterator

import pytest

from rainier_sync import QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers.base import Waker
from rainier_sync.drivers.sqs import SqsQueue, SqsUnavailableError
from rainier_sync.errors import QueueUnavailableError
from tests.support import free_port, wait_until

from . import jobs
from .jobs import Note
from .test_driver import job

pytestmark = pytest.mark.sqs

TIMEOUT = 1.0
#: Three tries of at most TIMEOUT to connect and TIMEOUT for the answer, the client's backoff between
#: them (at most 1 s, then 2 s), and slack for a busy machine.
BOUND = 3 * 2 * TIMEOUT + 3 + 10


@pytest.fixture
def frozen_endpoint() -> Iterator[str]:
    """A server that takes connections and never answers (a hung endpoint)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel accepts; nobody reads
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def refused_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"


def driver_on(endpoint: str, **options: Any) -> SqsQueue:
    options.setdefault("timeout", TIMEOUT)
    return SqsQueue(
        f"{endpoint}/123456789012/jobs",
        failed_queue_url=f"{endpoint}/123456789012/jobs-failed",
        endpoint=endpoint,
        region="us-east-1",
        key="testing",
        secret="testing",
        visibility_timeout=5,
        wait_time=1,
        **options,
    )


def timed(call: Callable[[], Any]) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(QueueUnavailableError) as caught:
        call()
    return caught.value, time.monotonic() - start


@pytest.mark.parametrize("kind", ["frozen_endpoint", "refused_endpoint"])
def test_dispatch_and_reserve_raise_queue_unavailable_naming_the_connection(
    request: pytest.FixtureRequest, kind: str
) -> None:
    endpoint: str = request.getfixturevalue(kind)
    q = driver_on(endpoint)
    manager = QueueManager({"bulk": q}, registry=jobs.registry())
    try:
        error, took = timed(lambda: manager.dispatch(Note(tag="x")))
        assert isinstance(error, SqsUnavailableError)
        assert "'bulk'" in str(error) and endpoint in str(error) and "testing" not in str(error)
        assert took < BOUND, f"dispatch took {took:.1f}s to give up"
        for call in (
            lambda: q.reserve_many(["default"], 5),
            lambda: q.push_many([job(), job()]),
            lambda: q.size("default"),
            lambda: q.failed_count(),
        ):
            error, took = timed(call)
            assert "'bulk'" in str(error) and took < BOUND
    finally:
        manager.close()


def test_a_long_poll_on_an_endpoint_that_hangs_reports_it_at_the_next_wait(frozen_endpoint: str) -> None:
    q = driver_on(frozen_endpoint)
    waker = Waker()
    try:
        q.wait_for_jobs(["default"], 0, waker)  # the poll starts in the background
        deadline = time.monotonic() + BOUND + 1  # its wait (1 s) plus the bound
        error: BaseException | None = None
        while error is None and time.monotonic() < deadline:
            try:
                q.wait_for_jobs(["default"], 0.2, waker)
            except QueueUnavailableError as exc:
                error = exc
            waker.clear()
        assert error is not None, "the poll's failure was never reported"
        assert "'default'" in str(error)
    finally:
        q.close()
        waker.close()


def test_a_worker_on_an_endpoint_that_hangs_reports_it_and_stops(frozen_endpoint: str) -> None:
    q = driver_on(frozen_endpoint)
    manager = QueueManager({"sqs": q}, registry=jobs.registry())
    failures: list[dict[str, Any]] = []
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=0.2))
    with signals.queue_operation_failed.connected_to(lambda sender, **kw: failures.append(kw)):
        worker.start()
        try:
            wait_until(lambda: len(failures) >= 2, timeout=2 * BOUND, message="the worker to report the outage")
        finally:
            worker.stop()
            worker.join(timeout=BOUND)
    assert worker._thread is not None and not worker._thread.is_alive(), "stop() did not end the worker"
    assert all(f["connection"] == "sqs" and "'sqs'" in f["error"] for f in failures)
    manager.close()
