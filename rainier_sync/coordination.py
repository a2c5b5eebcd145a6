"""What a manager keeps in its lock store beside unique locks: paused queues,
batches, chains and job results; and what it reads there of the workers (their
records and counts). A :class:`~rainier_sync.QueueManager` is built with one
:class:`Coordination` over itself and hands these methods to it, to keep the
manager's own module about dispatching."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

from .batch import Batch, PendingBatch
from .batch import cancel as cancel_batch
from .batch import listing as list_batches
from .batch import read as read_batch
from .chain import PendingChain
from .drivers.extensions import LendsLocks
from .errors import ConfigurationError
from .execution import result_key
from .jobs import Job, check_queue_name
from .pending import PendingDispatch
from .state.base import STORE_HINT, LockStore
from .types import QueuedJob, Result, decode

if TYPE_CHECKING:
    from .drivers.base import BaseQueue
    from .fleet import MinuteCounts, WorkerInfo
    from .manager import QueueManager

__all__ = ["Coordination", "store_of"]

log = logging.getLogger("rainier_sync")


class Coordination:
    """Paused queues, batches, chains and results of one manager, kept in its
    lock store (``manager.locks``); the fleet, read there."""

    def __init__(self, manager: QueueManager, *, said_no_store: bool) -> None:
        self._manager = manager
        #: ``locks=None`` was given (else a missing store is one the default connection's backend cannot hold).
        self._said_no_store = said_no_store

    def store(self, what: str) -> LockStore:
        """The lock store, for ``what``; without one a ConfigurationError naming ``locks`` and what to write."""
        locks = self._manager.locks
        if locks is None:
            raise ConfigurationError(self.no_store(what))
        return locks

    def no_store(self, what: str) -> str:
        """Why ``what`` finds no lock store, and what to write."""
        manager = self._manager
        if self._said_no_store:
            why = "the manager was given locks=None"
        elif manager.default is None:
            why = "the manager has no default connection to keep one in"
        else:
            queue = manager.connection(manager.default)
            why = f"its default connection {manager.default!r} ({queue.kind}) has no backend that can hold one"
        return f"{what} needs a lock store, and {why}: {STORE_HINT}, or QueueResources(locks=...) booting from config"

    # -- batches and chains -----------------------------------------------------------
    def batch(self, jobs: Sequence[Job], name: str | None = None) -> PendingBatch:
        """A batch of jobs counted as one piece of work: ``manager.batch(jobs,
        name=...).then(J()).catch(F()).finally_(C()).dispatch()`` returns a :class:`Batch`."""
        return PendingBatch(self._manager, jobs, name)

    def find_batch(self, batch_id: str) -> Batch | None:
        """The batch as stored now, or None (never made, or expired)."""
        return read_batch(self._manager, batch_id)

    def batches(self, limit: int = 100) -> list[Batch]:
        """The batches still kept, newest first."""
        return list_batches(self._manager, limit)

    def cancel_batch(self, batch_id: str) -> bool:
        """Cancel a batch: its jobs not yet started are skipped. False when there is no such batch."""
        return cancel_batch(self._manager, batch_id)

    def chain(self, jobs: Sequence[Job | PendingDispatch]) -> PendingChain:
        """A chain of jobs, each run only after the one before it succeeded:
        ``manager.chain([A(), B()]).catch(Failed()).dispatch()`` returns the chain's id."""
        return PendingChain(self._manager, jobs)

    # -- paused queues ----------------------------------------------------------------
    def pause(self, queue: str, connection: str | None = None) -> None:
        """Stop every worker of ``connection`` (the default), in any process, from
        claiming jobs of ``queue`` (within its ``sleep``); running jobs finish and
        dispatching still works. Kept in the lock store the workers share."""
        self._pause_flag(queue, connection, True)

    def resume(self, queue: str, connection: str | None = None) -> None:
        """Let workers claim from a paused ``queue`` again."""
        self._pause_flag(queue, connection, False)

    def paused(self, connection: str | None = None) -> set[str]:
        """The paused queues of ``connection`` (the default); empty without a
        lock store, where no queue can be paused."""
        locks = self._manager.locks
        if locks is None:
            return set()
        return locks.flags(self._pause_group(connection))

    def _pause_group(self, connection: str | None) -> str:
        self._manager.connection(connection)  # an undeclared connection is an error, never the default
        return f"paused:{connection or self._manager.default}"

    def _pause_flag(self, queue: str, connection: str | None, on: bool) -> None:
        check_queue_name(queue)
        group = self._pause_group(connection)
        self.store("pausing a queue").set_flag(group, queue, on)

    # -- the fleet ----------------------------------------------------------------------
    def workers(self, connection: str | None = None) -> list[WorkerInfo]:
        """The workers of ``connection`` (every connection when None), in any
        process, as they last recorded themselves in the lock store: a record
        lapses about 30 s after its worker stopped refreshing it. Without a lock
        store, a ConfigurationError naming ``locks``."""
        from .fleet import list_workers

        return list_workers(self.store("listing the workers"), self._fleet_connections(connection))

    def throughput(self, connection: str | None = None, minutes: int = 60) -> list[MinuteCounts]:
        """What the workers of ``connection`` (every connection when None), in
        any process, finished in each of the last ``minutes`` minutes, oldest
        first (kept two hours). Without a lock store, a ConfigurationError naming ``locks``."""
        from .fleet import read_throughput

        locks = self.store("reading the workers' throughput")
        return read_throughput(locks, self._fleet_connections(connection), minutes)

    def _fleet_connections(self, connection: str | None) -> list[str]:
        if connection is None:
            return sorted(self._manager.connections)
        self._manager.connection(connection)  # an undeclared connection is an error
        return [connection]

    # -- results -----------------------------------------------------------------------
    def keeps(self, jobs: list[QueuedJob]) -> bool:
        """Whether any of ``jobs`` keeps a result; refused before anything is stored without a lock store."""
        manager = self._manager
        for queued in jobs:
            cls = manager.registry.find(queued.name)
            if cls is not None and cls.KEEP_RESULT is not None:
                if manager.locks is None:
                    raise ConfigurationError(
                        self.no_store(f"job {queued.name!r} keeps its result (KEEP_RESULT), which")
                    )
                return True
        return False

    def mark_pending(self, jobs: list[QueuedJob], *, gone: bool = False) -> None:
        """Mark the jobs that keep a result as pending, so ``result()`` tells them
        from unknown ones (``gone``: their push failed, so take the mark back)."""
        locks, registry = self._manager.locks, self._manager.registry
        assert locks is not None
        for queued in jobs:
            cls = registry.find(queued.name)
            if cls is None or cls.KEEP_RESULT is None:
                continue
            if gone:
                try:
                    locks.put_value(result_key(queued.id), '{"status":"unknown"}', 0.001)
                except Exception:  # noqa: BLE001 - the push's own error is the one to raise
                    log.warning("job %s: its pending result mark could not be taken back", queued.id)
            else:  # kept while it waits and runs (a week), then as long as its result
                locks.put_value(result_key(queued.id), '{"status":"pending"}', 7 * 86400 + cls.KEEP_RESULT)

    def result(self, job_id: str, wait: float | None = None) -> Result:
        """The result of a job whose class keeps results (``KEEP_RESULT``):
        ``Result(status, value, error)``, status ``pending``, ``processed``,
        ``failed`` or ``unknown``. With ``wait``, waits up to that many seconds
        while it is pending (woken when it finishes where the store can)."""
        locks = self.store("reading a result")
        key = result_key(job_id)

        def finished(text: str | None) -> bool:
            return text is None or decode(text).get("status") != "pending"

        if wait is not None and wait > 0:
            text = locks.wait_value(key, float(wait), finished)
        else:
            text = locks.get_value(key)
        if text is None:
            return Result("unknown")
        record = decode(text)
        return Result(str(record.get("status", "unknown")), record.get("value"), record.get("error"))


def store_of(driver: BaseQueue) -> LockStore | None:
    """The store in ``driver``'s own backend, which a manager whose default
    connection it is uses when given no ``locks=``; None where the backend cannot
    hold one (SQS, sync).

    A driver that declares ``lends_locks``: what its ``lock_store()`` returns. A memory queue's is
    a :class:`~rainier_sync.locks.MemoryLockStore` (the same one for every
    manager over that queue); a database queue's a
    :class:`~rainier_sync.locks.DatabaseLockStore` on the queue's own connection
    (its tables come with the queue's migrations); a Redis queue's a
    :class:`~rainier_sync.locks.RedisLockStore` on the queue's own client
    (server, database, Sentinel or cluster) and reconnect settings, under the
    queue's prefix with its last ``queue:`` made ``lock:`` (``rainier:queue:``
    gives ``rainier:lock:``, the store's own default), or ``lock:`` added to a
    prefix that has none. A Kafka queue: the store it keeps its leases in."""
    if not driver.capabilities.lends_locks:
        return None
    store = LendsLocks.of(driver).lock_store()
    return store if isinstance(store, LockStore) else None
