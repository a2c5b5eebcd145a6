"""Celery with its Redis broker and no result backend: ``celery -A adapters.peer_celery worker -P threads -c C``.

Celery's ``group(...).apply_async()`` publishes one message per task, so it
is not counted as a batch API.
"""

from __future__ import annotations

from celery import Celery

from adapters.base import Adapter, Settings, record_run, script

app = Celery("peers", broker=Settings.from_env().redis_url)
app.conf.task_ignore_result = True


@app.task
def noop(index: int) -> None:
    record_run(index)


class CeleryAdapter(Adapter):
    name = "celery"
    library = "celery"
    backend = "redis"
    job_module = "adapters.peer_celery"

    def worker_commands(self) -> list[list[str]]:
        threads = str(self.settings.concurrency)
        return [
            script("celery", "-A", self.job_module, "worker", "-P", "threads", "-c", threads, "--loglevel", "WARNING")
        ]

    def enqueue_one(self, index: int) -> None:
        noop.delay(index)

    def close(self) -> None:
        app.close()
