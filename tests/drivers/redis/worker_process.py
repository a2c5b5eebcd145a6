"""A worker process for the Redis reliability tests (the CLI is tested on its own).

python -m tests.drivers.redis.worker_process URL PREFIX RESERVATION CONCURRENCY {once|forever}
"""

from __future__ import annotations

import sys

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import RedisQueue
from tests.drivers.redis import jobs


def main(argv: list[str]) -> int:
    url, prefix, reservation, concurrency, mode = argv
    driver = RedisQueue.from_url(url, prefix=prefix, reservation=float(reservation))
    manager = QueueManager({"redis": driver}, registry=jobs.registry(), container=jobs.container(url))
    worker = Worker(
        manager,
        options=WorkerOptions(
            queues=["default"], concurrency=int(concurrency), once=mode == "once", sleep=0.2, reclaim_interval=0.2
        ),
    )
    worker.install_signal_handlers()
    stats = worker.run()
    manager.close()
    print(f"processed={stats.processed} released={stats.released} failed={stats.failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
