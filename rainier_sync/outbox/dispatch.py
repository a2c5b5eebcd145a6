"""What the manager does with a dispatch ``.within(conn)`` to a connection that
cannot write in the caller's transaction: the checks, then the outbox."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .. import signals
from ..errors import ConfigurationError
from ..unique import unguarded

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..drivers.database.outbox import Outbox
    from ..registry import JobRegistry
    from ..state.base import LockStore
    from ..types import QueuedJob


class Dispatching(Protocol):
    """What a dispatch through the outbox needs of its manager."""

    default: str | None
    outbox: Outbox | None
    locks: LockStore | None
    registry: JobRegistry

    def _keeps(self, jobs: list[QueuedJob]) -> bool: ...

__all__ = ["Dispatching", "check_outbox", "relayable", "send_through_outbox"]

_ELSEWHERE = "a relay in another process (outbox:relay) would publish its jobs into its own memory"
_DECLARE = (
    "QueueManager(..., outbox=Outbox.from_url(<the database URL of the connection you pass to within()>)), "
    "or outbox = true on the connection in the queues configuration"
)


def check_outbox(outbox: Outbox, connections: dict[str, BaseQueue]) -> None:
    """At boot: every connection the outbox names is declared, and needs it."""
    if outbox.connections is None:
        return
    for name in sorted(outbox.connections):
        driver = connections.get(name)
        if driver is None:
            declared = ", ".join(sorted(connections)) or "none"
            raise ConfigurationError(
                f"{outbox.describe()} names connection {name!r}, which is not declared (declared: {declared})"
            )
        if driver.capabilities.transactional_dispatch:
            raise ConfigurationError(
                f"{outbox.describe()} names connection {name!r} ({driver.describe()}), which writes a job in the "
                "caller's transaction itself: leave it out of the outbox"
            )
        if not driver.promises.deferred:
            raise ConfigurationError(
                f"{outbox.describe()} names connection {name!r} ({driver.kind}), which runs a job inside dispatch: "
                "there is nothing to relay it to"
            )
        if not driver.promises.survives_a_restart:
            raise ConfigurationError(
                f"{outbox.describe()} names connection {name!r} ({driver.kind}), whose jobs live in one process's "
                f"memory: {_ELSEWHERE}"
            )


def relayable(driver: BaseQueue) -> bool:
    """Whether a relay publishes to ``driver``: it cannot write in the caller's
    transaction itself, keeps its jobs for a worker, and keeps them outside
    the relay's own process."""
    promises = driver.promises
    return not driver.capabilities.transactional_dispatch and promises.deferred and promises.survives_a_restart


def send_through_outbox(
    manager: Dispatching, name: str | None, driver: BaseQueue, jobs: list[QueuedJob], within: Any
) -> list[str | None]:
    """Write ``jobs`` for connection ``name`` into the manager's outbox on the
    caller's connection ``within``, in its transaction; ids as ``dispatch`` gives them.
    First the connection's own checks (:meth:`~rainier_sync.drivers.base.Producer.check`):
    a job it would refuse raises here, before the caller commits.

    A unique job takes its lock when the relay publishes it, so a rolled-back
    transaction leaves no lock behind; one whose lock is held now (a copy is
    queued or running) is dropped here, as any duplicate is."""
    name = name or manager.default or "default"
    outbox = manager.outbox
    if not driver.promises.deferred:
        raise TypeError(
            f"connection {name!r} ({driver.kind}) runs a job inside dispatch, so it cannot dispatch within a "
            "caller's transaction: the job would run before the transaction commits"
        )
    if not driver.promises.survives_a_restart:
        raise ConfigurationError(
            f"connection {name!r} ({driver.kind}) keeps its jobs in this process's memory, so it cannot take them "
            f"through the outbox: {_ELSEWHERE}"
        )
    if outbox is None:
        raise ConfigurationError(
            f"connection {name!r} ({driver.describe()}) cannot write a job in the caller's transaction, and the "
            f"manager declares no outbox to write it in instead: declare one with {_DECLARE}"
        )
    if not outbox.covers(name):
        covered = ", ".join(sorted(outbox.connections or ())) or "none"
        raise ConfigurationError(
            f"connection {name!r} ({driver.describe()}) is not one {outbox.describe()} takes jobs for "
            f"(it takes: {covered}); add it to the outbox's connections (outbox = true on its declaration)"
        )
    if manager.registry.keeping_results():
        manager._keeps(jobs)  # refuses KEEP_RESULT without a lock store, before anything is written
    for job in jobs:
        driver.check(job)  # what a direct dispatch would refuse, refused before the caller commits
    locks = manager.locks
    ids: list[str | None] = []
    to_write: list[QueuedJob] = []
    for job in jobs:
        if job.unique_key is not None:
            if locks is None:
                unguarded(job)
            elif locks.owner(job.unique_key) is not None:
                ids.append(None)
                continue
        ids.append(job.id)
        to_write.append(job)
    if to_write:
        if signals.job_dispatching.receivers:
            signals.emit(signals.job_dispatching, manager, jobs=to_write, connection=name)
        outbox.write(within, name, to_write)
    return ids
