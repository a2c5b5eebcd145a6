"""How a relay publishes the rows it took: each connection's jobs with
``push_many`` (in pieces its driver stores whole, where it says so), what a
failed push had done taken into account, and a job its connection refuses
set aside on its own, so it never holds up the rows behind it.

A push that fails is read for what went through (:mod:`..drivers.pushed`):
those rows are deleted, those refused for good set aside. Of the rest, an
outage (:class:`~rainier_sync.errors.QueueUnavailableError`) keeps them all
for the next pass and rests the connection; any other error is the refusal of
some job, and the jobs are pushed one at a time, so only the ones that fail on
their own are set aside. Before each push the relay renews its hold on the
rows (on SQLite a claim can lapse) and leaves out any it no longer holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..drivers.pushed import pushed_before
from ..errors import QueueUnavailableError
from ..types import QueuedJob
from ..unique import admit_relayed, release_relayed

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..drivers.database.outbox import Hold, Outbox, Row
    from ..manager import QueueManager

__all__ = ["Publishing", "RelayStats"]

log = logging.getLogger("rainier_sync")

_Item = tuple[int, QueuedJob]


@dataclass
class RelayStats:
    """What a relay did: rows ``relayed`` (published and deleted), unique jobs
    dropped as ``duplicates``, and rows ``refused`` by their connection (set aside
    in the outbox with the reason)."""

    relayed: int = 0
    duplicates: int = 0
    refused: int = 0


class Publishing:
    """The relay's publishing of one batch (a part of :class:`~rainier_sync.outbox.Relay`)."""

    manager: QueueManager
    outbox: Outbox
    stats: RelayStats

    def _failed(self, name: str, driver: BaseQueue, operation: str, exc: BaseException, items: Sequence[_Item]) -> None:
        raise NotImplementedError

    def _recovered(self, name: str) -> None:
        raise NotImplementedError

    def _publish(self, rows: list[Row], hold: Hold) -> tuple[list[int], dict[int, str]]:
        """Publish ``rows``: each connection's jobs in order. Returns the rows to
        delete (published, or dropped as duplicates) and why each row set aside was."""
        done: list[int] = []
        refused: dict[int, str] = {}
        groups: dict[str, list[_Item]] = {}
        for seq, name, body in rows:
            try:
                job = QueuedJob.decode(body, connection=name)
            except Exception as exc:  # noqa: BLE001 - whatever reading one row raises costs only that row
                refused[seq] = f"unreadable: {exc}"
                log.error("outbox row %d was set aside in %s: it cannot be read: %s", seq, self.outbox.describe(), exc)
                continue
            groups.setdefault(name, []).append((seq, job))
        for name, items in groups.items():
            driver = self.manager.connection(name)
            try:
                items = self._admit(items, done)
            except Exception as exc:  # noqa: BLE001 - the lock store failed: these rows wait
                self._failed(name, driver, "relay (unique locks)", exc, items)
                continue
            if items:
                self._push_connection(name, driver, items, hold, done, refused)
        self.stats.refused += len(refused)
        return done, refused

    def _push_connection(
        self, name: str, driver: BaseQueue, items: list[_Item], hold: Hold, done: list[int], refused: dict[int, str]
    ) -> None:
        """One connection's rows, piece by piece; an outage leaves the pieces after it."""
        before = len(refused)
        for piece in _pieces(items, driver.atomic_batch):
            held = hold([seq for seq, _ in piece])
            piece = [(seq, job) for seq, job in piece if seq in held]
            if piece and not self._push_piece(name, driver, piece, hold, done, refused):
                break
        if len(refused) > before:
            set_aside = [job for seq, job in items if seq in refused]
            release_relayed(self.manager.locks, set_aside)
            if self.manager.registry.keeping_results() and self.manager._keeps(set_aside):
                self.manager._mark_pending(set_aside, gone=True)

    def _push_piece(
        self, name: str, driver: BaseQueue, piece: list[_Item], hold: Hold, done: list[int], refused: dict[int, str]
    ) -> bool:
        """One ``push_many``; False after an outage (the connection rests)."""
        jobs = [job for _, job in piece]
        manager = self.manager
        try:
            if manager.registry.keeping_results() and manager._keeps(jobs):
                manager._mark_pending(jobs)
            if len(jobs) == 1:
                driver.push(jobs[0])
            else:
                driver.push_many(jobs)
        except Exception as exc:  # noqa: BLE001 - what went through is kept; the rest is sorted out below
            rest = self._sort_out(name, driver, piece, exc, done, refused)
            if not rest:
                self._recovered(name)
                return True
            if isinstance(exc, QueueUnavailableError):
                self._failed(name, driver, "relay", exc, rest)
                return False
            return self._push_each(name, driver, rest, hold, done, refused)
        done.extend(seq for seq, _ in piece)
        self.stats.relayed += len(piece)
        self._recovered(name)
        return True

    def _push_each(
        self, name: str, driver: BaseQueue, items: list[_Item], hold: Hold, done: list[int], refused: dict[int, str]
    ) -> bool:
        """After a push its connection refused: one job at a time, setting aside
        only those refused on their own; False after an outage."""
        for index, (seq, job) in enumerate(items):
            if seq not in hold([seq]):
                continue
            try:
                driver.push(job)
            except Exception as exc:  # noqa: BLE001 - sorted out: stored, refused, or an outage
                if not self._sort_out(name, driver, [(seq, job)], exc, done, refused):
                    continue
                if isinstance(exc, QueueUnavailableError):
                    self._failed(name, driver, "relay", exc, items[index:])
                    return False
                self._refuse(refused, name, driver, seq, job, str(exc) or type(exc).__name__)
                continue
            done.append(seq)
            self.stats.relayed += 1
        self._recovered(name)
        return True

    def _sort_out(
        self, name: str, driver: BaseQueue, piece: list[_Item], exc: BaseException, done: list[int],
        refused: dict[int, str],
    ) -> list[_Item]:  # fmt: skip
        """What the push that raised ``exc`` says it stored (deleted) and refused for
        good (set aside); returns the rest."""
        went = pushed_before(exc)
        rest: list[_Item] = []
        for seq, job in piece:
            if job.id in went.stored:
                done.append(seq)
                self.stats.relayed += 1
            elif job.id in went.refused:
                self._refuse(refused, name, driver, seq, job, went.refused[job.id])
            else:
                rest.append((seq, job))
        return rest

    def _refuse(
        self, refused: dict[int, str], name: str, driver: BaseQueue, seq: int, job: QueuedJob, why: str
    ) -> None:
        refused[seq] = f"connection {name!r} ({driver.kind}) refused it: {why}"
        log.error(
            "outbox row %d (job %s, %s, queue %r) was refused by connection %r and set aside in %s: %s; "
            "outbox:refused lists such rows, outbox:retry puts them back",
            seq, job.id, job.name, job.queue, name, self.outbox.describe(), why,
        )  # fmt: skip

    def _admit(self, items: list[_Item], done: list[int]) -> list[_Item]:
        """The rows to publish: unique jobs take their locks (see
        :func:`~rainier_sync.unique.admit_relayed`); each duplicate dropped has its
        ``seq`` put in ``done``, so its row is deleted."""
        locks = self.manager.locks
        if locks is None:
            return items
        dropped = admit_relayed(locks, [job for _, job in items])
        if not dropped:
            return items
        self.stats.duplicates += len(dropped)
        done.extend(items[index][0] for index in sorted(dropped))
        return [item for index, item in enumerate(items) if index not in dropped]


def _pieces(items: list[_Item], atomic: int | None) -> list[list[_Item]]:
    """``items`` as one push, or, for a driver that stores at most ``atomic`` jobs of
    one queue whole, per queue in pieces of that many (in order within each queue)."""
    if atomic is None:
        return [items]
    by_queue: dict[str, list[_Item]] = {}
    for item in items:
        by_queue.setdefault(item[1].queue, []).append(item)
    return [group[start : start + atomic] for group in by_queue.values() for start in range(0, len(group), atomic)]


def describe_rows(items: Sequence[_Item], most: int = 5) -> str:
    """``outbox row 4 (job ab12...)``, for messages: the first ``most`` of ``items``."""
    shown = ", ".join(f"{seq} (job {job.id})" for seq, job in items[:most])
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return f"outbox row{'s' if len(items) > 1 else ''} {shown}{more}"
