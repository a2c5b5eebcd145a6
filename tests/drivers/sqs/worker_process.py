"""A worker process on an SQS connection, for tests that kill or stop it.

python -m tests.drivers.sqs.worker_process ENDPOINT QUEUE_URL FAILED_QUEUE_URL VISIBILITY
    [--queue-urls JSON] [--concurrency N] [--once]

Serves ``default`` and every queue in ``--queue-urls`` (in that order), and
prints ``gave back N`` each time its driver hands jobs back.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from rainier_sync import QueuedJob, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.sqs import SqsQueue
from tests.drivers.sqs.jobs import registry


class ReportingSqsQueue(SqsQueue):
    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        super().give_back(jobs)
        if jobs:
            print(f"gave back {len(jobs)}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("queue_url")
    parser.add_argument("failed_url")
    parser.add_argument("visibility", type=float)
    parser.add_argument("--queue-urls", default="{}")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)
    queue_urls: dict[str, str] = json.loads(args.queue_urls)
    driver = ReportingSqsQueue(
        args.queue_url,
        queue_urls=queue_urls,
        failed_queue_url=args.failed_url,
        endpoint=args.endpoint,
        region="us-east-1",
        key="testing",
        secret="testing",
        visibility_timeout=args.visibility,
        wait_time=1,
    )
    manager = QueueManager({"sqs": driver}, registry=registry())
    queues = ["default", *queue_urls]
    options = WorkerOptions(queues=queues, concurrency=args.concurrency, sleep=0.5, once=args.once)
    worker = Worker(manager, options=options)
    worker.install_signal_handlers()
    stats = worker.run()
    manager.close()
    print(f"stats {stats.processed} {stats.failed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
