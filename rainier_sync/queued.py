"""A job as the :class:`~rainier_sync.types.QueuedJob` a dispatch stores: its
payload checked, its name on the wire, its due time and, for a unique job, its
lock's key and owner."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .errors import JobDefinitionError
from .jobs import Job, check_job_class
from .types import QueuedJob

if TYPE_CHECKING:
    from .registry import JobRegistry

__all__ = ["new_id", "queued_job"]

#: Job classes whose settings a dispatch has checked.
_checked_classes: set[type] = set()


def new_id() -> str:
    """A random 128-bit id, as 32 hex digits."""
    return os.urandom(16).hex()


def queued_job(
    registry: JobRegistry,
    default: str | None,
    job: Job,
    now: float,
    job_id: str,
    queue: str | None,
    delay: float,
    tries: int | None,
    priority: int | None,
    connection: str | None,
) -> QueuedJob:
    """``job`` as a dispatch at ``now`` stores it (nothing is sent); a job whose
    name ``registry`` gives to another class is refused."""
    if not isinstance(job, Job):
        raise TypeError(f"can only dispatch a rainier_sync.Job, got {type(job).__name__}")
    job_class = type(job)
    name = getattr(job_class, "NAME", None)
    if not isinstance(name, str) or not name:
        raise JobDefinitionError(f"{job_class.__qualname__} has no NAME: it cannot go on the wire")
    if job_class not in _checked_classes:
        check_job_class(job_class)
        _checked_classes.add(job_class)
    known = registry.find(name)
    if known is not None and known is not job_class:
        raise JobDefinitionError(
            f"job name {name!r} is registered to {known.__qualname__}, not {job_class.__qualname__}"
        )
    payload, text = job.encoded_payload()
    queued = QueuedJob(
        job_id,
        name,
        queue or job_class.QUEUE,
        payload,
        connection or default or "default",
        0,
        tries if tries is not None else job_class.TRIES,
        priority if priority is not None else job_class.PRIORITY,
        now + delay,
        None,
        None,
        None,
        now,
    )
    queued.payload_json = text  # checked just now: the envelope reuses it instead of encoding it again
    unique = job.unique_id()
    if unique is not None:
        queued.unique_key = f"{name}:{unique}"
        queued.unique_owner = new_id()
        queued.unique_for = float(job_class.UNIQUE_FOR)
    return queued
