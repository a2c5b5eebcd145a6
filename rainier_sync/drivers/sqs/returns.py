"""Putting received SQS messages back: released for a retry, handed back or
deferred without spending a try, or re-sent when a delay outlasts SQS's 15
minutes. SQS counts every receive, so a job that must not spend a try goes
back as a copy carrying the attempts made before its receive."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, Sequence

from ... import _clock
from ...errors import SqsBatchError
from ...types import QueuedJob
from . import wire
from .client import Receipt, SqsLink, is_fifo, reaching
from .receipts import Receipts

log = logging.getLogger("rainier_sync")

#: ChangeMessageVisibility stays below SQS's 12-hour ceiling.
MAX_VISIBILITY = 43_000


def visible_now(receipt: Receipt) -> dict[str, Any]:
    return {"ReceiptHandle": receipt.handle, "VisibilityTimeout": 0}


def delete_entry(receipt: Receipt) -> dict[str, Any]:
    return {"ReceiptHandle": receipt.handle}


class PuttingBack:
    """The operations of :class:`~rainier_sync.drivers.sqs.consumer.SqsConsumer`
    that put a received message back."""

    link: SqsLink
    receipts: Receipts

    def _lapsed(self, job: QueuedJob) -> bool:
        raise NotImplementedError

    def _on_receipt(self, operation: str, job: QueuedJob, method: str, **params: Any) -> None:
        raise NotImplementedError

    def _not_returned(self, job: QueuedJob, done: str) -> None:
        """``job``'s reservation lapsed: its message is visible again, or another
        worker runs it, so changing it (or sending a copy) would hide or double
        that run. It is left to SQS, whose next receive counts the attempt."""
        log.warning(
            "job %s (%s) not %s: its reservation lapsed, so SQS delivers it again and that receive counts "
            "as an attempt",
            job.id,
            job.name,
            done,
        )
        self.receipts.settled([job])

    def _hop(self, job: QueuedJob, remaining: float) -> None:
        """Re-send a job whose delay outlasts SQS's 15 minutes with what is left."""
        receipt: Receipt = job.receipt
        url = receipt.url
        if not self.receipts.was_hopped(receipt):
            entry = wire.entry(replace(job, receipt=None), url, _clock.now())
            if "DelaySeconds" not in entry:
                entry["DelaySeconds"] = wire.hop_delay(remaining)
            self.link.client.send_message(QueueUrl=url, **entry)
            self.receipts.mark_hopped(receipt)
        self.link.client.delete_message(QueueUrl=url, ReceiptHandle=receipt.handle)
        self.receipts.hop_finished(receipt)

    @reaching("release a job")
    def release(self, job: QueuedJob, delay: float = 0) -> None:
        """``ChangeMessageVisibility`` to the delay (0: at once); a delay past 15
        minutes re-sends the job with it instead."""
        receipt: Receipt | None = job.receipt
        if receipt is None:
            return
        if self._lapsed(job):
            # Its message is visible again, or another worker runs it: changing
            # it (or sending a later copy) would hide or duplicate that run.
            self._not_returned(job, "released")
            return
        wait = max(0.0, float(delay))
        if wire.one_delay(wait) or is_fifo(receipt.url):
            visibility = min(MAX_VISIBILITY, math.ceil(wait))
            self._on_receipt("release", job, "change_message_visibility", VisibilityTimeout=visibility)
            self.receipts.settled([job])
            return
        if not self.receipts.was_copied(receipt):
            later = replace(job, receipt=None, available_at=_clock.now() + wait)
            self.link.client.send_message(QueueUrl=receipt.url, **wire.entry(later, receipt.url, _clock.now()))
            self.receipts.mark_copied(receipt)
        self._on_receipt("release", job, "delete_message")
        self.receipts.settled([job])

    @reaching("hand jobs back")
    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Hand back jobs that never started, or whose attempt a stopping worker
        interrupted, available at once and without spending a try.

        SQS counts every receive, so on a standard queue each job is sent again
        carrying the attempts before this one, and only then is the received
        message deleted: the next receive hands it out with the same
        ``attempts``. A copy that went out is not sent again when the call is
        repeated after a failed delete. A FIFO queue keeps the group's order
        instead: the message is made visible again, and that receive counts.
        """
        standard: list[QueuedJob] = []
        fifo: list[QueuedJob] = []
        for job in jobs:
            if not isinstance(job.receipt, Receipt):
                continue
            if self._lapsed(job):
                # Another receive may hold it now: a copy would run beside it.
                self._not_returned(job, "handed back")
                continue
            (fifo if is_fifo(job.receipt.url) else standard).append(job)
        if standard:
            self._copy_back(standard)
        if fifo:
            self.link.receipt_batch("change_message_visibility_batch", fifo, visible_now)
            self.receipts.settled(fifo)

    @reaching("defer a job")
    def defer(self, job: QueuedJob, delay: float) -> None:
        """Send the job again, due in ``delay`` seconds with the attempts before
        this receive, then delete the received message. A FIFO queue cannot take
        a delayed copy: there the message is released and the receive counts."""
        if not isinstance(job.receipt, Receipt):
            return
        if is_fifo(job.receipt.url):
            self.release(job, delay)
            return
        if self._lapsed(job):
            self._not_returned(job, "deferred")
            return
        self._copy_back([job], max(0.0, float(delay)))

    def _copy_back(self, jobs: Sequence[QueuedJob], delay: float = 0.0) -> None:
        """Send each job again with the attempts before its receive (due in
        ``delay`` seconds), then delete the received messages (copies first: a
        crash between the two leaves a job twice, never nowhere)."""
        now = _clock.now()
        by_url: dict[str, list[tuple[QueuedJob, dict[str, Any]]]] = {}
        for job in jobs:
            receipt: Receipt = job.receipt
            if not self.receipts.was_copied(receipt):
                due = now + delay if delay > 0 else job.available_at
                copy = replace(job, receipt=None, attempts=max(0, job.attempts - 1), available_at=due)
                by_url.setdefault(receipt.url, []).append((job, wire.entry(copy, receipt.url, now)))
        refused: dict[str, str] = {}
        for url, items in by_url.items():
            for batch in wire.size_batches(items):
                sent, bad = self.link.send_batch(url, batch)
                for job in sent:
                    self.receipts.mark_copied(job.receipt)
                refused.update(bad)
        if refused:
            # Nothing is deleted until every copy is out; a repeat sends only the missing ones.
            sent_ids = [job.id for job in jobs if self.receipts.was_copied(job.receipt)]
            raise SqsBatchError("SendMessageBatch", sent_ids, refused)
        self.link.receipt_batch("delete_message_batch", jobs, delete_entry)
        self.receipts.settled(jobs)
