"""A worker in a process of its own, sharing a real backend and its lock store
with the dashboard under test: ``python -m tests.flask.fleet_worker KIND URL
PREFIX`` (KIND ``database`` or ``redis``) works the queues ``default`` and
``mail`` of connection ``main`` until they are empty, then exits, printing
``<processed> <failed>``."""

from __future__ import annotations

import sys

from rainier_sync import Container, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.locks import LockStore

from .apps import Quiet, registry


def backend(kind: str, url: str, prefix: str) -> tuple[BaseQueue, LockStore]:
    """The queue and the lock store at ``url``, as the dashboard's test made them."""
    if kind == "redis":
        from rainier_sync.drivers import RedisQueue
        from rainier_sync.locks import RedisLockStore

        queue = RedisQueue.from_url(url, prefix=prefix, reservation=30)
        return queue, RedisLockStore.from_url(url, prefix=prefix + "lock:")
    if kind == "database":
        from rainier_sync.drivers.database import DatabaseQueue
        from rainier_sync.locks import DatabaseLockStore

        return DatabaseQueue.from_url(url, reservation=30), DatabaseLockStore.from_url(url)
    raise SystemExit(f"fleet_worker: KIND must be database or redis, not {kind!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: python -m tests.flask.fleet_worker KIND URL PREFIX")
    queue, locks = backend(*argv)
    manager = QueueManager(
        connections={"main": queue}, registry=registry().with_job(Quiet), container=Container(), locks=locks
    )
    try:
        stats = Worker(manager, options=WorkerOptions(queues=["default", "mail"], once=True)).run()
    finally:
        manager.close()
    print(stats.processed, stats.failed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
