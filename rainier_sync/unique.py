"""Unique jobs' locks as a dispatch takes them: at dispatch for every driver
(:func:`admit`), given back after a failed push (:func:`release`), and, for a
dispatch that went through the outbox, when the relay publishes it
(:func:`admit_relayed`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from .locks.base import LockStore
    from .types import QueuedJob

__all__ = ["admit", "release", "admit_relayed", "unguarded"]

log = logging.getLogger("rainier_sync")

#: What a relay writes in the lock store beside a unique job's lock: "a relay took this row".
RELAYED = "outbox-relayed:"


def unguarded(job: QueuedJob) -> None:
    """A unique job dispatched with no lock store: said every time, and sent as an ordinary job."""
    log.warning("job %s is unique but no lock store is configured: dispatched without deduplication", job.unique_key)
    job.unique_key = job.unique_owner = None


def admit(
    locks: LockStore | None, jobs: Iterable[QueuedJob], ids: list[str | None], locked: list[QueuedJob]
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


def release(locks: LockStore | None, locked: list[QueuedJob]) -> None:
    """After a failed push: the unique locks its jobs took."""
    if locks is None:
        return
    for job in locked:
        try:
            locks.release(job.unique_key or "", job.unique_owner or "")
        except Exception:  # noqa: BLE001 - the push error is the one to raise
            log.exception("could not release unique lock %s after a failed push", job.unique_key)


def admit_relayed(locks: LockStore, jobs: Sequence[QueuedJob]) -> set[int]:
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


def _acquire(locks: LockStore, wanted: Sequence[tuple[str, str, float]]) -> list[bool]:
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
