"""A worker process for the workflow (chain and batch) process tests.

python -m tests.contract.workflow_worker KIND URL PREFIX CONCURRENCY RESERVATION

KIND is ``redis`` (RedisQueue + RedisLockStore under PREFIX) or ``postgres``
(DatabaseQueue + its lock store on URL; PREFIX unused). Works the queue
:data:`~tests.contract.workflow_jobs.QUEUE` until SIGTERM, then prints its
stats as one JSON line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

from rainier_sync import QueueManager, Worker, WorkerOptions
from tests.contract import workflow_jobs


def connect(kind: str, url: str, prefix: str, reservation: float) -> tuple[Any, Any]:
    if kind == "redis":
        from rainier_sync.drivers import RedisQueue
        from rainier_sync.locks import RedisLockStore

        return RedisQueue.from_url(url, prefix=prefix, reservation=reservation), RedisLockStore.from_url(
            url, prefix=prefix + "lock:"
        )
    from rainier_sync.drivers.database import DatabaseQueue

    driver = DatabaseQueue.from_url(url, reservation=reservation)
    return driver, driver.lock_store()


def main(argv: list[str]) -> int:
    kind, url, prefix, concurrency, reservation = argv
    driver, locks = connect(kind, url, prefix, float(reservation))
    manager = QueueManager({kind: driver}, locks=locks, registry=workflow_jobs.registry())
    options = WorkerOptions(
        queues=[workflow_jobs.QUEUE], concurrency=int(concurrency), sleep=0.05, reclaim_interval=0.25
    )
    worker = Worker(manager, options=options)
    worker.install_signal_handlers()
    print("ready", file=sys.stderr, flush=True)  # a SIGTERM from here on stops it gracefully
    totals = asdict(worker.run())
    manager.close()
    print(json.dumps(totals), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
