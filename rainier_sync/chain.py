"""Chains: jobs run one after another, each only after the one before it succeeded.

``manager.chain([FetchInvoice(7), RenderPdf(7), MailInvoice(7)]).catch(ChainFailed(7)).dispatch()``

Every link is built (and its payload checked) when the chain is dispatched;
the first is queued, carrying the rest in its ``meta``. When a link succeeds,
the next is handed over; when a link fails for good, the chain stops and its
``catch`` job is handed over.

On the database driver, a next link (or ``catch`` job) bound for the worker's
own connection is stored in the transaction that acknowledges (or fails) the
link, only if the link's row was still held: exactly once, with no guard
(``Capabilities.hands_over``, the executor's ``_hand_over``).

Elsewhere (and for a link bound for another connection, or a unique one) the
worker queues the next link before it acknowledges the link. The hand-over
cannot be lost: a crash before the acknowledgement runs the link again, and it
queues the next link again. Nor doubled: each link carries the key
``chain:<id>:<step>`` (``meta["once"]``), and of two copies of one step only
the first to run takes the key and runs; the other is skipped
(:mod:`rainier_sync.once`). The same holds for ``catch``. The first link is
always guarded so, so a chain needs a lock store that every worker shares.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from . import _clock
from .errors import ConfigurationError
from .jobs import Job
from .once import DEFAULT_HOLD
from .pending import PendingDispatch
from .types import QueuedJob

if TYPE_CHECKING:
    from .pending import Dispatcher

__all__ = ["PendingChain", "next_link", "catch_job", "fresh_copy", "hand_over"]

Link = Job | PendingDispatch


class PendingChain:
    """A chain being built: ``manager.chain([A(), B(), C()]).catch(J()).dispatch()``.

    A link is a job, or a :meth:`~rainier_sync.QueueManager.pending` dispatch
    (to send it to another queue or connection, or with a delay).
    """

    def __init__(self, manager: Any, links: Sequence[Link]) -> None:
        self._manager = manager
        if isinstance(links, (Job, PendingDispatch)) or not isinstance(links, Sequence):
            raise TypeError(f"a chain takes a list of jobs, got {type(links).__name__}")
        if not links:
            raise ValueError("a chain needs at least one job: got an empty list")
        for index, link in enumerate(links):
            if not isinstance(link, (Job, PendingDispatch)):
                raise TypeError(f"link {index} of the chain is {link!r}, not a Job (or a pending dispatch of one)")
            _check_registered(manager, link, f"link {index} of the chain")
        self._links = list(links)
        self._catch: Link | None = None

    @property
    def links(self) -> list[Link]:
        return list(self._links)

    @property
    def catch_link(self) -> Link | None:
        return self._catch

    def catch(self, job: Link) -> PendingChain:
        """Queue ``job`` once if a link fails for good (the chain stops there)."""
        if not isinstance(job, (Job, PendingDispatch)):
            raise TypeError(f"a chain's catch must be a Job, got {job!r}")
        _check_registered(self._manager, job, "the chain's catch")
        self._catch = job
        return self

    def dispatch(self) -> str:
        """Queue the first link; returns the chain's id."""
        manager = self._manager
        manager._store("a chain (each link run once)")
        chain_id = os.urandom(16).hex()
        built = [_built(manager, link) for link in self._links]
        catch = _built(manager, self._catch) if self._catch is not None else None
        now = _clock.now()
        rest = [[connection, job.to_wire(), max(0.0, job.available_at - now)] for connection, job in built[1:]]
        connection, first = built[0]
        first.meta = _meta(chain_id, 0, rest, catch)
        manager.send_queued(connection, [first])
        return chain_id


def _check_registered(manager: Any, link: Link, what: str) -> None:
    job = link if isinstance(link, Job) else link.job
    name = type(job).NAME
    if manager.registry.find(name) is None and not getattr(manager, "records_only", False):
        raise ConfigurationError(f"{what}: job {name!r} is not registered")


def _built(manager: Any, link: Link) -> tuple[str | None, QueuedJob]:
    if isinstance(link, PendingDispatch):
        return link.build()
    return manager.default, manager.build(link)


def _meta(
    chain_id: str, step: int, rest: list[Any], catch: tuple[str | None, QueuedJob] | list[Any] | None
) -> dict[str, Any]:
    if isinstance(catch, tuple):
        catch = [catch[0], catch[1].to_wire()]
    return {
        "once": f"chain:{chain_id}:{step}",
        "hold": DEFAULT_HOLD,
        "chain": {"id": chain_id, "step": step, "rest": rest, "catch": catch},
    }


def next_link(finished: QueuedJob) -> tuple[str | None, QueuedJob] | None:
    """The link to queue after ``finished`` succeeded (None: the chain is done)."""
    chain = (finished.meta or {}).get("chain")
    if not isinstance(chain, dict) or not chain.get("rest"):
        return None
    connection, wire, delay = chain["rest"][0]
    job = fresh_copy(wire, connection, float(delay))
    job.meta = _meta(chain["id"], int(chain["step"]) + 1, chain["rest"][1:], chain.get("catch"))
    return connection, job


def catch_job(failed: QueuedJob) -> tuple[str | None, QueuedJob] | None:
    """The chain's ``catch`` job to queue after ``failed`` failed for good, if it has one."""
    chain = (failed.meta or {}).get("chain")
    if not isinstance(chain, dict) or not chain.get("catch"):
        return None
    connection, wire = chain["catch"]
    job = fresh_copy(wire, connection, 0.0)
    job.meta = {"once": f"chain:{chain['id']}:catch", "hold": DEFAULT_HOLD}
    return connection, job


def fresh_copy(wire: dict[str, Any], connection: str | None, delay: float) -> QueuedJob:
    """A new job (its own id, no attempts) from an envelope kept for later."""
    job = QueuedJob.from_wire(wire, connection=connection or "default")
    now = _clock.now()
    job.id = os.urandom(16).hex()
    job.attempts = 0
    job.dispatched_at = now
    job.available_at = now + delay
    return job


def hand_over(dispatcher: Dispatcher | None, found: tuple[str | None, QueuedJob] | None) -> None:
    """Queue what :func:`next_link` or :func:`catch_job` found."""
    if found is None:
        return
    if dispatcher is None:
        raise ConfigurationError("this job is a link of a chain, and its executor has no manager to queue the next")
    connection, job = found
    dispatcher.send_queued(connection, [job])


class RecordedChain(PendingChain):
    """A fake manager's chain: dispatching records its links and runs nothing."""

    def dispatch(self) -> str:
        links = [link if isinstance(link, Job) else link.job for link in self.links]
        self._manager.recording.chains.append(links)
        return os.urandom(16).hex()
