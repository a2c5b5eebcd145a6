"""What a driver declares it can do beyond the core port: read by the worker,
the manager, the command line and the dashboard, and by each extension of
:mod:`~rainier_sync.drivers.extensions` to say whether it is there."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Capabilities"]


@dataclass(frozen=True)
class Capabilities:
    """What a driver can do beyond the port's common ground, declared by the
    driver and read by the worker, the manager, the command line and the
    dashboard: nothing probes a driver for methods.

    Some flags say how a driver does what the core port asks (``give_back``,
    ``renews``...); each flag that names an extension class of
    :mod:`~rainier_sync.drivers.extensions` declares that the driver implements
    it. What a driver does not declare is refused by name.
    """

    #: A lower ``PRIORITY`` runs first within a queue.
    priority: bool = True
    #: Jobs claimed and never started go back without spending an attempt (:meth:`Consumer.give_back`),
    #: so the worker may claim ahead of its threads.
    give_back: bool = False
    #: :meth:`Consumer.extend` renews reservations: the worker's heartbeat keeps long jobs claimed.
    renews: bool = True
    #: :meth:`Consumer.wait_for_jobs` returns when a job is pushed (not only when its timeout passes).
    wakes: bool = False
    #: :meth:`Consumer.acknowledge_and_reserve` settles and claims in one round trip.
    combined_claim: bool = False
    #: :class:`~rainier_sync.drivers.extensions.StreamsPush`: stores a batch while it is being built.
    streaming_push: bool = False
    #: :class:`~rainier_sync.drivers.extensions.DispatchesWithin`: writes jobs in the caller's
    #: own database transaction.
    transactional_dispatch: bool = False
    #: :meth:`BaseQueue.check_eviction_policy` can tell whether the backend may evict jobs.
    eviction_check: bool = False
    #: :meth:`BaseQueue.migrate` creates or updates the backend's tables.
    migrations: bool = False
    #: :class:`~rainier_sync.drivers.extensions.ListsJobs`: reads the jobs stored, not only their counts.
    listing: bool = False
    #: :class:`~rainier_sync.drivers.extensions.HandsOver`: stores jobs in the transaction that
    #: settles another (a chain's next link, its catch job).
    hands_over: bool = False
    #: :class:`~rainier_sync.drivers.extensions.CountsBatches`: counts the jobs of batches with
    #: the acknowledgements that settle them, for a lock store in its own backend.
    counts_batches: bool = False
    #: :class:`~rainier_sync.drivers.extensions.CountsRetries`: takes a retried job's failure out
    #: of its batch's tally in the transaction that queues it again.
    counts_retries: bool = False
    #: :class:`~rainier_sync.drivers.extensions.LendsLocks`: lends a lock store in its own backend.
    lends_locks: bool = False
