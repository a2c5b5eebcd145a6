"""What the process tests share: a place of the test's own on a real server, a
driver and a lock store there, a manager on them, a ledger directory the
worker processes write to, and the worker processes themselves.

The test process and the workers it starts build their drivers and lock
stores with :func:`connect`, from the strings :meth:`Backend.argv` gives.

- ``postgres``: a DatabaseQueue and a DatabaseLockStore in the session's
  PostgreSQL schema; tests keep apart by their queue's name (or, with
  ``empty=True``, by deleting every job and lock first, for keys of fixed names);
- ``redis``: a RedisQueue and a RedisLockStore under a key prefix of the test's
  own, deleted after;
- ``sqs``: an SqsQueue on moto (a default queue, the test's queue and a failed
  queue, made for the test), its lock store on Redis under the test's prefix;
- ``kafka``: a KafkaQueue on tansu (topics and group of the test's own), its
  leases and lock store on Redis under the test's prefix.

Only :func:`open_backend` needs pytest; a worker process imports the rest.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rainier_sync import Job, JobRegistry, QueueManager

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("postgres", "redis", "sqs", "kafka")


def connect(kind: str, url: str, prefix: str, queue: str, reservation: float, locks_url: str) -> tuple[Any, Any]:
    """The driver and the lock store of a :class:`Backend`, from its :meth:`~Backend.argv`."""
    if kind == "postgres":
        from rainier_sync.drivers.database import DatabaseQueue
        from rainier_sync.locks import DatabaseLockStore

        return DatabaseQueue.from_url(url, reservation=reservation), DatabaseLockStore.from_url(locks_url)
    from rainier_sync.locks import RedisLockStore

    locks = RedisLockStore.from_url(locks_url, prefix=prefix + "lock:")
    if kind == "redis":
        from rainier_sync.drivers import RedisQueue

        return RedisQueue.from_url(url, prefix=prefix, reservation=reservation), locks
    if kind == "sqs":
        from rainier_sync.drivers.sqs import SqsQueue
        from tests.services.moto import REGION

        parts = urlsplit(url)
        return SqsQueue(
            url + "-default",
            queue_urls={} if queue == "default" else {queue: url + "-queue"},
            failed_queue_url=url + "-failed",
            endpoint=f"{parts.scheme}://{parts.netloc}",
            region=REGION,
            key="testing",
            secret="testing",
            visibility_timeout=max(1, round(reservation)),
            wait_time=1,
        ), locks
    if kind == "kafka":
        from rainier_sync.drivers.kafka import KafkaQueue
        from tests.services.tansu import FAST_GROUP

        tag = prefix.replace(":", ".").strip(".")
        return KafkaQueue(
            url,
            group=tag,
            topic_prefix=tag + ".",
            lease=reservation,
            locks=locks,
            # tansu reports a wrong high watermark after a multi-record batch (docs/drivers/kafka.rst)
            producer_config={"batch.num.messages": 1},
            consumer_config=FAST_GROUP,
        ), locks
    raise ValueError(f"no such backend {kind!r}: one of {', '.join(KINDS)}")


@dataclass
class Backend:
    """One real server, a place on it no other test uses, and a manager there."""

    kind: str
    #: The server: a database URL, a Redis URL, the test's SQS queues' URL stem, Kafka's bootstrap.
    url: str
    #: The test's Redis key prefix (unused by a database).
    prefix: str
    queue: str
    manager: QueueManager
    ledger: Path
    #: Where the lock store is: the database itself, or Redis.
    locks_url: str
    #: Long enough that no heartbeat missed under load lets a job run twice;
    #: a test that kills a worker shortens it so that the killed worker's jobs come back soon.
    reservation: float = 30.0

    def argv(self) -> list[str]:
        """What a worker process passes to :func:`connect` (after ``int``/``float`` of the reservation)."""
        return [self.kind, self.url, self.prefix, self.queue, str(self.reservation), self.locks_url]

    def dispatch(self, jobs: list[Job]) -> None:
        built = [self.manager.build(job, queue=self.queue, connection=self.kind) for job in jobs]
        for start in range(0, len(built), 200):
            self.manager.send_queued(self.kind, built[start : start + 200])

    def size(self) -> int:
        return int(self.manager.connection(self.kind).size(self.queue))


def from_argv(argv: list[str]) -> tuple[Any, Any, str]:
    """A worker process's driver, lock store and queue, from :meth:`Backend.argv`."""
    kind, url, prefix, queue, reservation, locks_url = argv
    driver, locks = connect(kind, url, prefix, queue, float(reservation), locks_url)
    return driver, locks, queue


@contextlib.contextmanager
def open_backend(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kind: str,
    registry: JobRegistry | None = None,
    queue: str | None = None,
    *,
    empty: bool = False,
    reservation: float = 30.0,
) -> Iterator[Backend]:
    """A :class:`Backend` of ``kind`` for this test (its server's mark applied;
    a missing server fails under CI, skips elsewhere), removed after.
    ``queue``: its queue's name (a fresh one when None)."""
    import pytest

    prefix = f"rstest:{uuid.uuid4().hex[:12]}:"
    queue = queue or f"q-{uuid.uuid4().hex[:10]}"
    made_sqs: list[str] = []
    if kind == "postgres":
        from tests.drivers.database.support import postgres_schema_url

        request.applymarker(pytest.mark.postgres)
        url = locks_url = postgres_schema_url(request)
    else:
        request.applymarker(pytest.mark.redis)
        url = locks_url = str(request.getfixturevalue("redis_url"))
    if kind == "sqs":
        from tests.services.moto import sqs_client_for

        client = sqs_client_for(request.getfixturevalue("sqs_endpoint"))
        stem = f"t-{uuid.uuid4().hex[:16]}"
        for suffix in ("-default", "-queue", "-failed"):
            made_sqs.append(client.create_queue(QueueName=stem + suffix)["QueueUrl"])
        url = made_sqs[0].removesuffix("-default")
    elif kind == "kafka":
        url = str(request.getfixturevalue("kafka_brokers"))
    driver, locks = connect(kind, url, prefix, queue, reservation, locks_url)
    if kind == "postgres":
        locks.migrate()
        if empty:
            for table in ("rainier_jobs", "rainier_failed_jobs", "rainier_locks"):
                driver._backend.execute(f"DELETE FROM {table}")
    manager = QueueManager({kind: driver}, locks=locks, registry=registry or JobRegistry())
    ledger = tmp_path / f"ledger-{kind}"
    ledger.mkdir()
    try:
        yield Backend(kind, url, prefix, queue, manager, ledger, locks_url, reservation)
    finally:
        manager.close()
        if kind != "postgres":
            import redis

            client = redis.Redis.from_url(locks_url)
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        for made in made_sqs:
            with contextlib.suppress(Exception):  # moto going away first is fine
                client.delete_queue(QueueUrl=made)


class Workers:
    """Worker subprocesses (``python -m MODULE ARGS... BACKEND-ARGV...``) of one
    test; whatever is still running at the end is killed. Each prints its
    stats as a last line of JSON."""

    def __init__(self, module: str, logs: Path) -> None:
        self.module = module
        self.logs = logs
        self.started: list[subprocess.Popen[str]] = []

    def start(self, backend: Backend, *args: str) -> subprocess.Popen[str]:
        stderr = open(self.logs / f"worker-{len(self.started)}.err", "w", encoding="utf-8")  # noqa: SIM115
        with stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *args, *backend.argv()],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.started.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
        """Wait for ``proc`` to end on its own (bounded); its stats."""
        out, _ = proc.communicate(timeout=timeout)
        index = self.started.index(proc)
        errors = (self.logs / f"worker-{index}.err").read_text(encoding="utf-8")
        assert proc.returncode == 0, f"worker {index} exited {proc.returncode}:\n{out}\n{errors[-4000:]}"
        stats: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return stats

    def stop(self, proc: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, Any]:
        proc.send_signal(signal.SIGTERM)
        return self.finish(proc, timeout=timeout)

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
