"""A script app: dispatch some work, run an embedded worker, stop it cleanly.

Run it with ``python examples/script_app.py``. It queues thumbnail jobs (one
of which fails once and is retried), runs a worker in a background thread the
way a long-running service embeds one, waits for the queue to empty, then
stops the worker and prints what happened. SIGTERM or Ctrl-C stops it early,
letting running jobs finish.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, backoff, signals
from rainier_sync.drivers import MemoryQueue


class Thumbnailer:
    """A service the jobs resolve from the container."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self._flaked = False
        self._lock = threading.Lock()

    def make(self, path: str) -> None:
        with self._lock:
            if path.endswith("flaky.png") and not self._flaked:
                self._flaked = True
                raise ConnectionError("image service timed out")
            self.made.append(path)


@dataclass
class MakeThumbnail(Job):
    NAME = "media.make-thumbnail"
    QUEUE = "media"
    TRIES = 3
    BACKOFF = backoff.none

    path: str

    def handle(self, context: JobContext) -> None:
        context.resolve(Thumbnailer).make(self.path)


def main() -> int:
    thumbnailer = Thumbnailer()
    queue = MemoryQueue()
    manager = QueueManager(
        connections={"main": queue},
        registry=JobRegistry().with_job(MakeThumbnail),
        container=Container().instance(Thumbnailer, thumbnailer),
    )
    paths = [f"uploads/{n}.png" for n in ("cat", "dog", "flaky", "owl")]
    manager.dispatch_many([MakeThumbnail(p) for p in paths])

    retried: list[str] = []

    def on_released(sender: Any, **event: Any) -> None:
        retried.append(f"{event['job'].payload['path']} ({event['error']})")

    signals.job_released.connect(on_released)
    worker = Worker(manager, options=WorkerOptions(queues=["media"], concurrency=2, sleep=0.5))
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
    worker.start()
    idle = threading.Event()
    while queue.size() and not worker.stopping:
        idle.wait(0.01)
    worker.stop()
    stats = worker.join(10)
    print(f"thumbnails: {', '.join(sorted(thumbnailer.made))}")
    print(f"retried: {', '.join(retried) or 'none'}")
    print(f"processed {stats.processed}, released {stats.released}, failed {stats.failed}")
    return 0 if stats.failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
