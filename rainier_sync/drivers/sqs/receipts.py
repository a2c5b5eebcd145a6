"""What a consumer knows of the messages it received: when each reservation
lapses, which are handed out, and which copies already went out."""

from __future__ import annotations

import threading
from typing import Iterable, Sequence

from ...types import QueuedJob
from .client import Receipt


class Receipts:
    """The receipts one consumer holds, by our own reckoning (SQS does not say
    when a visibility timeout runs out). Safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # message ids handed out and not settled yet
        self._outstanding: set[str] = set()
        # receipt handle -> when its reservation lapses (monotonic)
        self._deadlines: dict[str, float] = {}
        # receipt handles whose later copy or failed entry went out and whose
        # delete did not yet: a repeated release() or fail() sends it once
        self._copied: set[str] = set()
        # message ids hopped whose original was not deleted yet: it comes back,
        # and then it is only deleted (its copy went out already)
        self._hopped: set[str] = set()

    def received(self, receipts: Iterable[Receipt], deadline: float) -> None:
        with self._lock:
            for receipt in receipts:
                self._deadlines[receipt.handle] = deadline

    def deadline(self, receipt: Receipt) -> float | None:
        with self._lock:
            return self._deadlines.get(receipt.handle)

    def lapsed(self, job: QueuedJob, now: float) -> bool:
        """Whether ``job``'s reservation has run out (received plus the
        visibility timeout, moved on by each renewal): SQS may have handed its
        message to another worker since."""
        receipt = job.receipt
        if not isinstance(receipt, Receipt):
            return False
        deadline = self.deadline(receipt)
        return deadline is not None and now >= deadline

    def renewed(self, jobs: Iterable[QueuedJob], deadline: float) -> None:
        with self._lock:
            for job in jobs:
                if job.receipt.handle in self._deadlines:
                    self._deadlines[job.receipt.handle] = deadline

    def forget(self, receipts: Sequence[Receipt]) -> None:
        with self._lock:
            for receipt in receipts:
                self._deadlines.pop(receipt.handle, None)

    def handed_out(self, jobs: list[QueuedJob]) -> list[QueuedJob]:
        with self._lock:
            self._outstanding.update(job.receipt.message_id for job in jobs)
        return jobs

    def settled(self, jobs: Sequence[QueuedJob]) -> None:
        with self._lock:
            for job in jobs:
                if isinstance(job.receipt, Receipt):
                    self._outstanding.discard(job.receipt.message_id)
                    self._deadlines.pop(job.receipt.handle, None)
                    self._copied.discard(job.receipt.handle)

    def none_out(self) -> bool:
        """True when every job handed out is settled."""
        with self._lock:
            return not self._outstanding

    def was_copied(self, receipt: Receipt) -> bool:
        with self._lock:
            return receipt.handle in self._copied

    def mark_copied(self, receipt: Receipt) -> None:
        with self._lock:
            self._copied.add(receipt.handle)

    def was_hopped(self, receipt: Receipt) -> bool:
        with self._lock:
            return receipt.message_id in self._hopped

    def mark_hopped(self, receipt: Receipt) -> None:
        """Its later copy went out."""
        with self._lock:
            self._hopped.add(receipt.message_id)

    def hop_finished(self, receipt: Receipt) -> None:
        """Its original is deleted too."""
        with self._lock:
            self._hopped.discard(receipt.message_id)
