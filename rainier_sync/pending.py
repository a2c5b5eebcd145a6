"""A dispatch being built: ``manager.pending(job).on_queue("high").delay(30).send()``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from .jobs import Job, check_count, check_queue_name
from .types import MAX_COUNT, QueuedJob

__all__ = ["PendingDispatch", "Dispatcher"]


@runtime_checkable
class Dispatcher(Protocol):
    """What a pending dispatch needs of its manager."""

    default: str | None

    def connection(self, name: str | None = None) -> Any: ...

    def build(
        self,
        job: Job,
        *,
        queue: str | None = None,
        delay: float = 0.0,
        tries: int | None = None,
        priority: int | None = None,
        connection: str | None = None,
    ) -> QueuedJob: ...

    def send_queued(self, connection: str | None, jobs: list[QueuedJob], *, within: Any = None) -> list[str | None]: ...


def _seconds(name: str, value: float | timedelta) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be seconds (a number) or a timedelta, got {value!r}")
    if value < 0 or value != value:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return float(value)


class PendingDispatch:
    """A dispatch being built: ``manager.pending(job).on_queue("high").delay(30).send()``."""

    __slots__ = ("_manager", "_job", "_queue", "_connection", "_delay", "_tries", "_priority", "_within")

    def __init__(self, manager: Dispatcher, job: Job) -> None:
        self._manager = manager
        self._job = job
        self._queue: str | None = None
        self._connection: str | None = None
        self._delay = 0.0
        self._tries: int | None = None
        self._priority: int | None = None
        self._within: Any = None

    def on_queue(self, queue: str) -> PendingDispatch:
        self._queue = check_queue_name(queue)
        return self

    def on_connection(self, connection: str) -> PendingDispatch:
        self._manager.connection(connection)  # refuse an undeclared one now, not at send()
        self._connection = connection
        return self

    def delay(self, seconds: float | timedelta) -> PendingDispatch:
        self._delay = _seconds("delay", seconds)
        return self

    def tries(self, tries: int) -> PendingDispatch:
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise ValueError(f"tries must be an int >= 1, got {tries!r}")
        self._tries = check_count("tries", tries, 1)
        return self

    def priority(self, priority: int) -> PendingDispatch:
        self._priority = check_count("priority", priority, -MAX_COUNT)
        return self

    def within(self, connection: Any) -> PendingDispatch:
        """Write the job on the caller's open database connection (psycopg,
        sqlite3 or PyMySQL, or a SQLAlchemy ``Connection`` or ``Session``), so it
        commits or rolls back with the caller's transaction: in the database
        driver's own table, or, for a connection that cannot write there (Redis,
        SQS, Kafka), in the manager's outbox, relayed after the commit."""
        self._within = connection
        return self

    @property
    def job(self) -> Job:
        """The job being dispatched."""
        return self._job

    def build(self) -> tuple[str | None, QueuedJob]:
        """Its connection and the job as it would be stored (nothing is sent)."""
        m = self._manager
        name = self._connection or m.default
        queued = m.build(
            self._job, queue=self._queue, delay=self._delay, tries=self._tries, priority=self._priority, connection=name
        )
        return name, queued

    def send(self) -> str | None:
        """Queue it; returns the job's id, or None when a unique duplicate was dropped."""
        name, queued = self.build()
        return self._manager.send_queued(name, [queued], within=self._within)[0]
