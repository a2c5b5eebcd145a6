"""RQ: ``rq worker`` (the default Worker, which forks a work horse per job), ``--processes`` of them."""

from __future__ import annotations

from collections.abc import Sequence

from adapters.base import Adapter, Settings, record_run, script


def noop(index: int) -> None:
    record_run(index)


class RqAdapter(Adapter):
    name = "rq"
    library = "rq"
    backend = "redis"
    job_module = "adapters.peer_rq"
    batch_api = "Queue.enqueue_many([Queue.prepare_data(...)])"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        import redis
        from rq import Queue

        self.queue = Queue("default", connection=redis.Redis.from_url(settings.redis_url))

    def worker_commands(self) -> list[list[str]]:
        command = script("rq", "worker", "--url", self.settings.redis_url, "--quiet", "default")
        return [command for _ in range(self.settings.processes)]

    def worker_description(self) -> str:
        return f"{self.settings.processes} proc (fork per job)"

    def enqueue_one(self, index: int) -> None:
        self.queue.enqueue(noop, index)

    def enqueue_many(self, indices: Sequence[int]) -> None:
        self.queue.enqueue_many([self.queue.prepare_data(noop, (index,)) for index in indices])

    def close(self) -> None:
        self.queue.connection.close()
