"""The quick start: define a job, dispatch it, run a worker until it is done."""

from __future__ import annotations

from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue


class Greeter:
    def greet(self, name: str) -> str:
        return f"Hello, {name}!"


@dataclass
class SayHello(Job):
    NAME = "examples.say-hello"
    TRIES = 3

    name: str

    def handle(self, context: JobContext) -> None:
        print(f"{context.resolve(Greeter).greet(self.name)} (job {context.id[:8]}, attempt {context.attempt})")


def main() -> None:
    container = Container().singleton(Greeter, lambda c: Greeter())
    manager = QueueManager(
        connections={"main": MemoryQueue()},
        registry=JobRegistry().with_job(SayHello),
        container=container,
    )
    for name in ("Ada", "Grace", "Barbara"):
        manager.dispatch(SayHello(name))
    stats = Worker(manager, options=WorkerOptions(once=True)).run()
    print(f"processed {stats.processed}, failed {stats.failed}")


if __name__ == "__main__":
    main()
