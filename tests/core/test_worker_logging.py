"""What the worker logs of a stored job (its name, queue, id, the error read
back) is escaped: a newline in it cannot forge a log line, nor a NUL reach the
log as a byte. On the memory driver and on a real Redis."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager
from rainier_sync.drivers import MemoryQueue
from rainier_sync.types import QueuedJob
from rainier_sync.worker import Worker, WorkerOptions

FORGED = "\nCRITICAL rainier_sync: forged\x00line"


@dataclass
class Echo(Job):
    """Fails with the text its payload carries."""

    NAME = "logging-tests.echo"
    TRIES = 2

    text: str = ""

    def backoff(self, attempt: int) -> float:
        return 0.0

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(self.text)


registry = JobRegistry().with_job(Echo)


@pytest.fixture(params=["memory", "redis"])
def driver(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryQueue(reservation=30)
        return
    pytest.importorskip("redis", reason="the redis extra is not installed")
    from rainier_sync.drivers.redis import RedisQueue

    prefix = f"rainier-test:logging:{uuid.uuid4().hex}:"
    queue = RedisQueue.from_url(request.getfixturevalue("redis_url"), prefix=prefix)
    yield queue
    keys = list(queue._client.scan_iter(match=f"{queue.keys.prefix}*", count=1000))
    if keys:
        queue._client.delete(*keys)
    queue.close()


def _lines(records: list[logging.LogRecord]) -> list[str]:
    formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    return [formatter.format(record) for record in records if record.name.startswith("rainier_sync")]


def test_a_stored_jobs_name_id_queue_and_error_are_escaped_in_the_log(
    driver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    manager = QueueManager({"main": driver}, "main", registry, Container())
    # A queue name holds no NUL anywhere, nor a newline on Redis (its stream lines are newline-separated).
    queue = "q\nCRITICAL rainier_sync: forged" if isinstance(driver, MemoryQueue) else "logging-tests"
    driver.push(QueuedJob(id=f"id{FORGED}", name=f"name{FORGED}", queue=queue, payload={}, max_attempts=3))
    manager.dispatch_on(queue, Echo(text=f"error{FORGED}"))
    with caplog.at_level(logging.INFO, logger="rainier_sync"):
        stats = Worker(manager, options=WorkerOptions(once=True, queues=[queue], concurrency=1)).run()
    assert stats.failed == 2 and stats.released == 1, stats
    lines = _lines(caplog.records)
    text = "\n".join(lines)
    assert "name\\nCRITICAL rainier_sync: forged\\x00line" in text, text  # named, escaped
    assert "error\\nCRITICAL rainier_sync: forged\\x00line" in text, text
    for line in lines:
        assert "\x00" not in line, line
        assert not any(part.startswith("CRITICAL rainier_sync: forged") for part in line.splitlines()), line


def test_escaped_keeps_printable_text_and_escapes_the_rest() -> None:
    from rainier_sync._text import escaped

    assert escaped("café: ünïcode 'quoted' \\ back") == "café: ünïcode 'quoted' \\ back"
    assert escaped("a\tb\rc\nd\x00e\x1bf\u2028g") == "a\\tb\\rc\\nd\\x00e\\x1bf\\u2028g"
    assert escaped(None) == "None" and escaped(ValueError("x\ny")) == "x\\ny"
    assert escaped("\udc80") == "\\udc80", "a lone surrogate would break a UTF-8 log stream"
    assert escaped("ab\ncdef", limit=3) == "ab\\n... (4 more characters)"


def test_a_huge_error_is_cut_in_its_log_line_and_kept_whole_in_the_failed_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from rainier_sync._text import LOGGED_ERROR

    queue = MemoryQueue(reservation=30)
    manager = QueueManager({"main": queue}, "main", registry, Container())
    huge = "x" * 10_000_000
    manager.dispatch(Echo(text=huge))
    with caplog.at_level(logging.INFO, logger="rainier_sync"):
        Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
        Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    [failed] = queue.failed
    assert huge in failed.error, "the store keeps the whole error"
    longest = max(len(line) for line in _lines(caplog.records))
    assert longest < LOGGED_ERROR + 500, longest
    assert any("more characters)" in line for line in _lines(caplog.records))
