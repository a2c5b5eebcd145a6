"""A worker process on an SQS connection, for tests that kill it.

python -m tests.drivers.sqs.worker_process ENDPOINT QUEUE_URL FAILED_QUEUE_URL VISIBILITY
"""

from __future__ import annotations

import sys

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.sqs import SqsQueue
from tests.drivers.sqs.jobs import registry


def main(argv: list[str]) -> int:
    endpoint, queue_url, failed_url, visibility = argv
    driver = SqsQueue(
        queue_url,
        failed_queue_url=failed_url,
        endpoint=endpoint,
        region="us-east-1",
        key="testing",
        secret="testing",
        visibility_timeout=float(visibility),
        wait_time=1,
    )
    manager = QueueManager({"sqs": driver}, registry=registry())
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=0.5))
    worker.install_signal_handlers()
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
