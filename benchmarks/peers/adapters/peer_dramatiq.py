"""Dramatiq on its Redis broker: ``dramatiq adapters.peer_dramatiq --processes 1 --threads C``.

Dramatiq has no batch enqueue (``group.run()`` sends one message per job).
"""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from adapters.base import Adapter, Settings, record_run, script

dramatiq.set_broker(RedisBroker(url=Settings.from_env().redis_url))


@dramatiq.actor
def noop(index: int) -> None:
    record_run(index)


class DramatiqAdapter(Adapter):
    name = "dramatiq"
    library = "dramatiq"
    backend = "redis"
    job_module = "adapters.peer_dramatiq"

    def worker_commands(self) -> list[list[str]]:
        threads = str(self.settings.concurrency)
        return [script("dramatiq", self.job_module, "--processes", "1", "--threads", threads)]

    def enqueue_one(self, index: int) -> None:
        noop.send(index)

    def close(self) -> None:
        dramatiq.get_broker().close()
