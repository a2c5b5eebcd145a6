"""What the dashboard's job pages show: the jobs of one queue in one state
(ready, delayed, reserved), filtered by name and paged, and one stored job with
the worker running it. No web framework here: the page builders render these.

A driver lists its jobs only where it declares ``Capabilities.listing``
(:meth:`~rainier_sync.drivers.base.Inspector.list_jobs`); elsewhere the page
shows the counts and says why there is nothing more to see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..drivers.extensions import ListsJobs
from ..types import JOB_STATES, JobState, ListedJob, QueueCounts

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..fleet import RunningJob, WorkerInfo
    from ..manager import QueueManager

__all__ = ["PAGE_SIZE", "BrowseView", "JobView", "browse_view", "job_view", "why_not_listed"]

#: Jobs per page.
PAGE_SIZE = 50
#: The furthest page a request may ask for (a deep OFFSET costs the backend what it skips).
LAST_PAGE = 2000

_WHY = {
    "sqs": (
        "SQS cannot show the messages a queue holds without receiving them, and a message received to be "
        "looked at is hidden from every worker until its visibility timeout passes. The counts are SQS's "
        "approximate numbers of messages (reserved includes jobs released with a backoff)."
    ),
    "kafka": (
        "Kafka keeps a queue as a log that consumers read by offset: listing its jobs would mean reading the "
        "topic beside the workers, and a job's state lives in the consumer group and the lock store, not in "
        "the record. The counts are the consumer group's lag on the queue's topics."
    ),
    "sync": "The sync driver runs each job as it is dispatched: it stores none to list.",
}


def why_not_listed(driver: BaseQueue) -> str | None:
    """Why ``driver``'s jobs cannot be listed, or None when they can."""
    if driver.capabilities.listing:
        return None
    return _WHY.get(
        driver.kind,
        f"The {driver.kind} driver does not list the jobs it stores (it does not declare Capabilities.listing).",
    )


@dataclass(frozen=True)
class JobRow:
    """A listed job, and the worker whose last record lists it as running."""

    listed: ListedJob
    worker: WorkerInfo | None = None
    running: RunningJob | None = None


@dataclass
class BrowseView:
    connection: str
    driver: str
    queue: str
    state: JobState
    #: Why the jobs cannot be listed (None when they can).
    why_not: str | None
    name: str = ""
    page: int = 1
    counts: QueueCounts | None = None
    rows: list[JobRow] = field(default_factory=list)
    has_next: bool = False
    #: How many jobs of the state a name filter looked at, when it stopped there
    #: before filling the page (the driver bounds a filter's scan); None when it did not stop.
    searched: int | None = None
    #: The workers could not be read from the lock store (the page still lists the jobs).
    fleet_error: str | None = None
    error: str | None = None

    @property
    def states(self) -> tuple[JobState, ...]:
        return JOB_STATES

    @property
    def first(self) -> int:
        """The position of the page's first job (1-based)."""
        return (self.page - 1) * PAGE_SIZE + 1

    @property
    def total(self) -> int | None:
        """How many jobs the state holds, when the page is not filtered (a filter's total is not counted)."""
        if self.counts is None or self.name:
            return None
        return int(getattr(self.counts, self.state))

    @property
    def last_page(self) -> int | None:
        total = self.total
        return None if total is None else max(1, -(-total // PAGE_SIZE))


def running_jobs(manager: QueueManager, connection: str) -> dict[str, tuple[WorkerInfo, RunningJob]]:
    """The jobs the workers of ``connection`` last recorded as running, by id
    (each worker lists its first :data:`~rainier_sync.fleet.RUNNING_SHOWN`)."""
    found: dict[str, tuple[WorkerInfo, RunningJob]] = {}
    if manager.locks is None:
        return found
    for worker in manager.workers(connection):
        for job in worker.running:
            found[job.id] = (worker, job)
    return found


def _with_workers(
    manager: QueueManager, connection: str, listed: list[ListedJob], view: BrowseView | JobView
) -> list[JobRow]:
    if not any(item.state == "reserved" for item in listed):
        return [JobRow(item) for item in listed]
    try:
        running = running_jobs(manager, connection)
    except Exception as exc:  # noqa: BLE001 - an unreachable lock store must not take the page down
        view.fleet_error = f"{type(exc).__name__}: {exc}"
        running = {}
    rows = []
    for item in listed:
        held = running.get(item.job.id) if item.state == "reserved" else None
        rows.append(JobRow(item, *held) if held is not None else JobRow(item))
    return rows


def browse_view(
    manager: QueueManager, connection: str, driver: BaseQueue, queue: str, state: JobState, name: str, page: int
) -> BrowseView:
    """One page of ``queue``'s jobs in ``state`` whose name contains ``name``."""
    page = max(1, min(page, LAST_PAGE))
    view = BrowseView(connection, driver.kind, queue, state, why_not_listed(driver), name=name, page=page)
    try:
        view.counts = driver.counts(queue)
        if view.why_not is not None:
            return view
        offset = (page - 1) * PAGE_SIZE
        listed = ListsJobs.of(driver).list_jobs(queue, state, name=name or None, offset=offset, limit=PAGE_SIZE + 1)
    except Exception as exc:  # noqa: BLE001 - an unreachable backend must not take the page down
        view.error = f"{type(exc).__name__}: {exc}"
        return view
    view.has_next = len(listed) > PAGE_SIZE
    if not listed.complete:  # the name filter stopped at the driver's bound before filling the page
        view.searched = listed.bound
    view.rows = _with_workers(manager, connection, listed[:PAGE_SIZE], view)
    return view


@dataclass
class JobView:
    connection: str
    driver: str
    job_id: str
    why_not: str | None
    row: JobRow | None = None
    #: Whether the failed store holds a job of this id (when it is not stored as queued).
    failed: bool = False
    fleet_error: str | None = None
    error: str | None = None


def job_view(manager: QueueManager, connection: str, driver: BaseQueue, job_id: str) -> JobView:
    """The stored job ``job_id`` (ready, delayed or reserved), and who runs it."""
    view = JobView(connection, driver.kind, job_id, why_not_listed(driver))
    try:
        found = ListsJobs.of(driver).find_job(job_id) if view.why_not is None else None
        if found is None:
            view.failed = driver.failed_job(job_id) is not None
            return view
    except Exception as exc:  # noqa: BLE001 - an unreachable backend must not take the page down
        view.error = f"{type(exc).__name__}: {exc}"
        return view
    (view.row,) = _with_workers(manager, connection, [found], view)
    return view
