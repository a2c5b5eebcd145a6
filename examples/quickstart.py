"""The quick start: define a job, dispatch it to a SQLite file, run a worker until it is done."""

from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import DatabaseQueue


@dataclass
class SayHello(Job):
    NAME = "examples.say-hello"  # on the wire: stable and unique
    TRIES = 3

    name: str

    def handle(self, context: JobContext) -> None:
        print(f"Hello, {self.name}! (attempt {context.attempt} of {context.max_attempts})")


queue = DatabaseQueue.from_url("sqlite:///quickstart.db")  # a file beside you: no server needed
queue.migrate()  # creates the tables the first time, does nothing after
manager = QueueManager(connections={"main": queue}, registry=JobRegistry().with_job(SayHello), container=Container())
manager.dispatch(SayHello("Ada"))  # stored in quickstart.db until a worker runs it
stats = Worker(manager, options=WorkerOptions(once=True)).run()  # runs what is due, then returns
print(f"processed {stats.processed}, failed {stats.failed}")
manager.close()
