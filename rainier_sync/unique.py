"""Unique jobs' locks as a dispatch takes them: at dispatch for every driver
(:func:`admit`; in the caller's transaction where the driver writes there and
the lock store is in that database, :func:`admit_within`), given back after a
failed push (:func:`release`), and, for a dispatch that went through the
outbox, when the relay publishes it (:func:`admit_relayed`), or given back
when its connection refused it (:func:`release_relayed`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .drivers.extensions import DispatchesWithin

if TYPE_CHECKING:
    from .drivers.base import BaseQueue
    from .state.base import Locks
    from .types import QueuedJob

__all__ = ["admit", "admit_within", "release", "release_within", "admit_relayed", "release_relayed", "unguarded"]

log = logging.getLogger("rainier_sync")

#: What a relay writes in the lock store beside a unique job's lock: "a relay took this row".
RELAYED = "outbox-relayed:"


def unguarded(job: QueuedJob) -> None:
    """A unique job dispatched with no lock store: said every time, and sent as an ordinary job."""
    log.warning("job %s is unique but no lock store is configured: dispatched without deduplication", job.unique_key)
    job.unique_key = job.unique_owner = None


def admit(
    locks: Locks | None, jobs: Iterable[QueuedJob], ids: list[str | None], locked: list[QueuedJob]
) -> list[QueuedJob]:
    """Take the unique jobs' locks; returns the jobs to push, and appends each
    job's id to ``ids`` (None for a duplicate dropped) and each lock taken to ``locked``."""
    to_push: list[QueuedJob] = []
    for job in jobs:
        if job.unique_key is not None:
            if locks is None:
                unguarded(job)
            elif not locks.acquire(job.unique_key, job.unique_owner or "", job.unique_for or 3600):
                ids.append(None)
                continue
            else:
                locked.append(job)
        ids.append(job.id)
        to_push.append(job)
    return to_push


def admit_within(
    locks: Locks | None,
    driver: BaseQueue,
    within: Any,
    jobs: Iterable[QueuedJob],
    ids: list[str | None],
    locked: list[QueuedJob],
    held: list[tuple[str, str]],
) -> list[QueuedJob]:
    """:func:`admit` for a dispatch within the caller's transaction (``within``;
    None: :func:`admit` itself) to a driver that writes there: where the driver can (the lock store is in that database,
    :meth:`~rainier_sync.drivers.extensions.DispatchesWithin.lock_within`), the unique locks are
    taken in the caller's transaction and appended to ``held``; elsewhere in the
    lock store, as :func:`admit` does."""
    jobs = list(jobs)
    unique = [job for job in jobs if job.unique_key is not None]
    if within is None or locks is None or not unique:
        return admit(locks, jobs, ids, locked)
    wanted = [(job.unique_key or "", job.unique_owner or "", job.unique_for or 3600.0) for job in unique]
    took = DispatchesWithin.of(driver).lock_within(within, wanted)
    if took is None:
        return admit(locks, jobs, ids, locked)
    taken = {id(job): ok for job, ok in zip(unique, took, strict=True)}
    to_push: list[QueuedJob] = []
    for job in jobs:
        if job.unique_key is not None:
            if not taken[id(job)]:
                ids.append(None)
                continue
            held.append((job.unique_key, job.unique_owner or ""))
        ids.append(job.id)
        to_push.append(job)
    return to_push


def release(locks: Locks | None, locked: list[QueuedJob]) -> None:
    """After a failed push: the unique locks its jobs took."""
    if locks is None:
        return
    for job in locked:
        try:
            locks.release(job.unique_key or "", job.unique_owner or "")
        except Exception:  # noqa: BLE001 - the push error is the one to raise
            log.exception("could not release unique lock %s after a failed push", job.unique_key)


def release_within(driver: BaseQueue, within: Any, held: list[tuple[str, str]]) -> None:
    """After a failed ``push_within``: the locks :func:`admit_within` took in the caller's transaction."""
    if not held:
        return
    try:
        DispatchesWithin.of(driver).unlock_within(within, held)
    except Exception:  # noqa: BLE001 - the push error is the one to raise; a rollback takes them too
        log.exception("could not give back unique locks %s after a failed push", ", ".join(key for key, _ in held))


def admit_relayed(locks: Locks, jobs: Sequence[QueuedJob]) -> set[int]:
    """Take the locks of the unique ones among ``jobs`` (a relay's, from the
    outbox); returns the indexes of the duplicates to drop.

    Beside each lock goes a mark that a relay took the row. With no mark yet,
    the job is published when its lock is taken now, or was taken by a relay
    that died before marking it; it is dropped while another copy holds the
    lock. With the mark (a relay took the row and died before deleting it),
    the job is published again only while that relay's lock still stands:
    once it is let go, the copy that relay published has run.
    """
    unique = [(index, job) for index, job in enumerate(jobs) if job.unique_key is not None]
    if not unique:
        return set()
    wanted = [(job.unique_key or "", job.unique_owner or "", job.unique_for or 3600.0) for _, job in unique]
    took = _acquire(locks, wanted)
    # Half the lock's time: the mark lapses first, so it never outlives the lock it vouches for.
    marks = [(RELAYED + job.id, owner, ttl / 2) for (_, job), (_, owner, ttl) in zip(unique, wanted, strict=True)]
    first = _acquire(locks, marks)
    dropped: set[int] = set()
    for (index, job), (key, owner, _), taken, fresh in zip(unique, wanted, took, first, strict=True):
        if fresh:
            keep = taken or locks.owner(key) == owner
        else:
            keep = not taken and locks.owner(key) == owner
            if taken:
                locks.release(key, owner)
        if not keep:
            dropped.add(index)
            log.info("outbox: unique job %s (%s) dropped: a copy of it is queued, running or has run", job.id, key)
    return dropped


def release_relayed(locks: Locks | None, jobs: Iterable[QueuedJob]) -> None:
    """Jobs a relay took from the outbox and then set aside (their connection
    refused them): their locks and marks go, so the next dispatch of such a job
    is not dropped as the duplicate of one that exists nowhere."""
    if locks is None:
        return
    for job in jobs:
        if job.unique_key is None:
            continue
        owner = job.unique_owner or ""
        try:
            locks.release(job.unique_key, owner)
            locks.release(RELAYED + job.id, owner)
        except Exception:  # noqa: BLE001 - the row is set aside either way; the lock lapses in time
            log.exception("could not release unique lock %s of a job set aside in the outbox", job.unique_key)


def _acquire(locks: Locks, wanted: Sequence[tuple[str, str, float]]) -> list[bool]:
    """``acquire_many`` for ``(key, owner, ttl)`` triples, one call per distinct ttl."""
    results = [False] * len(wanted)
    by_ttl: dict[float, list[int]] = {}
    for index, (_, _, ttl) in enumerate(wanted):
        by_ttl.setdefault(ttl, []).append(index)
    for ttl, indexes in by_ttl.items():
        got = locks.acquire_many([(wanted[i][0], wanted[i][1]) for i in indexes], ttl)
        for index, ok in zip(indexes, got, strict=True):
            results[index] = ok
    return results
