"""The quick start: define a job, dispatch it to a SQLite file, run a worker until it is done."""

from __future__ import annotations

from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import DatabaseQueue


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
    queue = DatabaseQueue.from_url("sqlite:///quickstart.db")  # a file beside you; no server needed
    queue.migrate()  # creates the queue's tables the first time, does nothing after
    container = Container().singleton(Greeter, lambda c: Greeter())
    manager = QueueManager(
        connections={"main": queue},
        registry=JobRegistry().with_job(SayHello),
        container=container,
    )
    for name in ("Ada", "Grace", "Barbara"):
        manager.dispatch(SayHello(name))
    stats = Worker(manager, options=WorkerOptions(once=True)).run()
    print(f"processed {stats.processed}, failed {stats.failed}")
    manager.close()


if __name__ == "__main__":
    main()
