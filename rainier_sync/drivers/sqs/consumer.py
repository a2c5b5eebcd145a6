"""The consumer operations on SQS, and what they keep between calls.

Reserve is ``ReceiveMessage`` (the message's visibility timeout is the
reservation), acknowledge is ``DeleteMessage(Batch)``, release is
``ChangeMessageVisibility``. Every loop working through one driver shares its
consumer: a long poll per queue, the messages it brought in, and the receipts
handed out.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from typing import Any, Sequence

from ... import _clock, signals
from ...errors import PayloadError
from ...types import ExceptionInfo, FailedJob, QueuedJob, as_exception_info
from ..base import Consumer, Waker, as_job_list
from . import wire
from .client import BATCH, SYSTEM_ATTRIBUTES, Receipt, SqsLink, is_fifo, reaching, stale_receipt
from .failed import SqsFailedQueue
from .receipts import Receipts
from .returns import MAX_VISIBILITY, PuttingBack, delete_entry, visible_now

log = logging.getLogger("rainier_sync")

_Held = tuple[str, dict[str, Any], Receipt]


def _placeholder(queue: str, receipt: Receipt) -> QueuedJob:
    """A stand-in job for a held message, to settle its receipt with."""
    return QueuedJob(id=receipt.message_id, name="(held)", queue=queue, payload={}, receipt=receipt)


class SqsConsumer(PuttingBack, Consumer):
    """Claims, settlements and long polls of one :class:`SqsQueue`."""

    def __init__(self, link: SqsLink, failed: SqsFailedQueue, *, reservation: float, wait_time: int) -> None:
        self.link = link
        self.failed = failed
        self.reservation = reservation
        self.wait_time = wait_time
        self._lock = threading.Lock()
        self.buffer: list[_Held] = []  # messages a long poll brought in that no loop took yet
        self._polling: dict[str, float] = {}  # queue -> when its long poll started (monotonic)
        self.receipts = Receipts()
        self._poll_threads: set[threading.Thread] = set()
        self._poll_error: BaseException | None = None
        self._waiters: set[Waker] = set()
        self._closed = False

    def _operation_failed(self, exc: Exception) -> None:
        info = ExceptionInfo.from_exception(exc)
        signals.emit(
            signals.queue_operation_failed,
            self.link.owner,
            connection=self.link.connection,
            operation="reserve",
            error=info.error,
            exception=info,
        )

    # -- receiving ------------------------------------------------------------------------
    def _receive(self, queue: str, url: str, count: int, wait: int = 0) -> list[_Held]:
        start = _clock.monotonic()
        response = (self.link.poll_client if wait else self.link.client).receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=count,
            VisibilityTimeout=int(self.reservation),
            WaitTimeSeconds=wait,
            **{self.link.attributes_param: SYSTEM_ATTRIBUTES},
        )
        at = _clock.monotonic()
        received = [
            (queue, message, Receipt(queue, url, message["ReceiptHandle"], message["MessageId"], at))
            for message in response.get("Messages", [])
        ]
        if received:
            # The visibility started when SQS answered, a little before the answer
            # arrived (a long poll waits first); never before the request went out.
            deadline = max(start, at - min(1.0, self.reservation / 10)) + self.reservation
            self.receipts.received((receipt for _, _, receipt in received), deadline)
        return received

    def _lapsed(self, job: QueuedJob) -> bool:
        return self.receipts.lapsed(job, _clock.monotonic())

    @reaching("receive jobs")
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """``ReceiveMessage`` (up to ten per call), trying ``queues`` in order; a
        queue is left for the next only when it answered with nothing."""
        urls = [(queue, self.link.url_of(queue)) for queue in queues]
        if limit <= 0:
            return []
        taken = self._take_held(urls, limit)
        if taken:
            return self.receipts.handed_out(taken)
        with self._lock:
            # A poll running past its wait time is stuck on the network: look beside it.
            fresh = _clock.monotonic() - self.wait_time - 1
            polling = {queue for queue, started in self._polling.items() if started > fresh}
        try:
            for queue, url in urls:
                # A long poll in flight on this queue answers as soon as anything
                # there is visible, and wakes the worker: a short poll beside it finds nothing.
                if queue in polling:
                    continue
                fifo = is_fifo(url)
                while len(taken) < limit:
                    # FIFO: one at a time, so two jobs of one message group never run side by side.
                    want = 1 if fifo else min(BATCH, limit - len(taken))
                    messages = self._receive(queue, url, want)
                    for message in messages:
                        job = self._accept_safely(*message)
                        if job is not None:
                            taken.append(job)
                    if len(messages) < want:
                        break
                if taken:
                    break
        except Exception as exc:
            if not taken:
                raise
            # The jobs already received are invisible to everyone else: hand them
            # out, or they would lapse and come back with an attempt they never had.
            log.warning(
                "a receive failed after %d job(s) were taken; handing those out: %s",
                len(taken),
                ExceptionInfo.from_exception(exc).error,
            )
            self._operation_failed(exc)
            return self.receipts.handed_out(taken)
        # A long poll may have landed a message while we looked.
        return self.receipts.handed_out(taken or self._take_held(urls, limit))

    def _take_held(self, urls: Sequence[tuple[str, str]], limit: int) -> list[QueuedJob]:
        """Jobs from messages a long poll brought in, in queue order."""
        order = {queue: index for index, (queue, _) in enumerate(urls)}
        with self._lock:
            # Only messages of the queues asked for: another worker on this
            # connection may be waiting on others.
            held = [item for item in self.buffer if item[0] in order]
            self.buffer = [item for item in self.buffer if item[0] not in order]
        if not held:
            return []
        # Less than half the reservation left (heartbeats renew held messages
        # too): its visibility may lapse while it runs, and SQS hands it out again.
        fresh_until = _clock.monotonic() + self.reservation / 2
        deadlines = {item[2].handle: self.receipts.deadline(item[2]) for item in held}
        held.sort(key=lambda item: order.get(item[0], len(order)))
        taken: list[QueuedJob] = []
        for index, item in enumerate(held):
            if len(taken) >= limit:
                with self._lock:
                    self.buffer[:0] = held[index:]
                break
            deadline = deadlines[item[2].handle]
            if (item[2].received_at + self.reservation if deadline is None else deadline) < fresh_until:
                self.receipts.forget([item[2]])
                continue  # held too long: its visibility may lapse, and SQS hands it out again
            job = self._accept_safely(*item)
            if job is not None:
                taken.append(job)
        return taken

    def _accept_safely(self, queue: str, message: dict[str, Any], receipt: Receipt) -> QueuedJob | None:
        """:meth:`_accept`, where a failure to hop, discard or fail one message
        is reported and leaves it to reappear, without costing the others."""
        try:
            job = self._accept(queue, message, receipt)
            if job is None:
                self.receipts.forget([receipt])
            return job
        except Exception as exc:  # noqa: BLE001 - the message stays on SQS; its visibility lapses
            self.receipts.forget([receipt])
            info = ExceptionInfo.from_exception(exc)
            log.error("handling message %s from queue %r failed: %s", receipt.message_id, queue, info.error)
            self._operation_failed(exc)
            return None

    def _accept(self, queue: str, message: dict[str, Any], receipt: Receipt) -> QueuedJob | None:
        """The job a received message carries, or None when it was handled here:
        unreadable (discarded to the failed store) or not due yet (hopped)."""
        body = message.get("Body", "")
        try:
            job = wire.read(body, self.link.connection, receipt)
        except PayloadError as exc:
            self._discard(queue, body, receipt, exc)
            return None
        remaining = job.available_at - _clock.now()
        if remaining > 0 and not is_fifo(receipt.url):
            self._hop(job, remaining)
            return None
        received = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        # The body counts attempts made before this message was sent; SQS counts
        # the receives since, including those whose worker died mid-attempt. A job
        # past its last attempt is handed out too: the executor fails it as lost.
        job.attempts += max(1, received)
        return job

    def _discard(self, queue: str, body: str, receipt: Receipt, exc: Exception) -> None:
        info = ExceptionInfo.from_exception(exc)
        log.error(
            "discarded message %s from queue %r on connection %r into the failed store: %s",
            receipt.message_id,
            queue,
            self.link.connection,
            info.error,
        )
        self.failed.store(wire.unreadable_body(body, queue, receipt.message_id, info, _clock.now()))
        self.link.client.delete_message(QueueUrl=receipt.url, ReceiptHandle=receipt.handle)
        self.link.owner.announce_discarded(info, body)

    # -- settling ---------------------------------------------------------------------------
    def _on_receipt(self, operation: str, job: QueuedJob, method: str, **params: Any) -> None:
        """Call ``method`` with ``job``'s receipt; a receipt that no longer holds
        the message is logged, not raised (the worker would retry it forever)."""
        receipt: Receipt | None = job.receipt
        if receipt is None:
            return
        try:
            getattr(self.link.client, method)(QueueUrl=receipt.url, ReceiptHandle=receipt.handle, **params)
        except Exception as exc:
            if not stale_receipt(exc):
                raise
            log.warning(
                "could not %s job %s (%s): its message is gone, or its reservation lapsed and another "
                "receive holds it now (%s)",
                operation,
                job.id,
                job.name,
                exc,
            )

    @reaching("delete a finished job")
    def acknowledge(self, job: QueuedJob) -> None:
        self._on_receipt("acknowledge", job, "delete_message")
        self.receipts.settled([job])

    @reaching("delete finished jobs")
    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        """``DeleteMessageBatch``, ten per call."""
        self.link.receipt_batch("delete_message_batch", jobs, delete_entry)
        self.receipts.settled(jobs)

    @reaching("fail a job")
    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        """Send the job to the failed queue, then delete it from its own."""
        info = as_exception_info(error)
        failed_at = _clock.now()
        plain = replace(job, receipt=None)
        if self._lapsed(job):
            # Another receive may hold it now: a failed copy beside it would run
            # twice after a retry. The receive after its last attempt fails it.
            log.warning(
                "job %s (%s) failed (%s), but its reservation lapsed: nothing stored; SQS delivers it "
                "again, and that receive fails it or runs its next attempt",
                job.id,
                job.name,
                info.error,
            )
            self.receipts.settled([job])
            return FailedJob.of(plain, info, failed_at)
        if not (isinstance(job.receipt, Receipt) and self.receipts.was_copied(job.receipt)):
            self.failed.store(wire.failed_job_body(plain, info, failed_at))
            if isinstance(job.receipt, Receipt):
                self.receipts.mark_copied(job.receipt)
        self._on_receipt("fail", job, "delete_message")
        self.receipts.settled([job])
        return FailedJob.of(plain, info, failed_at)

    @reaching("renew reservations")
    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        """``ChangeMessageVisibilityBatch`` for running jobs (and messages a long
        poll brought in that no thread has taken yet)."""
        timeout = min(MAX_VISIBILITY, math.ceil(self.reservation if seconds is None else seconds))
        targets = as_job_list(jobs)
        # A held message nobody took for a while (its queue's worker stopped, or
        # is busy) goes back to its queue rather than being renewed for ever.
        cutoff = _clock.monotonic() - 2 * self.reservation - self.wait_time
        with self._lock:
            old = [item for item in self.buffer if item[2].received_at < cutoff]
            if old:
                self.buffer = [item for item in self.buffer if item[2].received_at >= cutoff]
            held = [_placeholder(queue, receipt) for queue, _, receipt in self.buffer]
        if old:
            self._let_go(old)
        start = _clock.monotonic()
        extended = self.link.receipt_batch(
            "change_message_visibility_batch",
            [job for job in targets if not self._lapsed(job)] + held,
            lambda receipt: {"ReceiptHandle": receipt.handle, "VisibilityTimeout": timeout},
        )
        self.receipts.renewed(extended, start + timeout)

    def reclaim_expired(self) -> int:
        """SQS itself makes a message visible again when its reservation lapses; 0."""
        return 0

    # -- waiting ------------------------------------------------------------------------------
    @reaching("wait for jobs")
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Long-poll each queue (``wait_time``) in the background, returning when
        one answers, ``waker`` is set, or ``timeout`` passes. A poll outlives an
        early return, so an idle worker costs one receive per queue per ``wait_time``."""
        urls = [(queue, self.link.url_of(queue)) for queue in queues]
        with self._lock:
            error, self._poll_error = self._poll_error, None
            if error is not None:
                raise error
            wanted = {queue for queue, _ in urls}
            if any(item[0] in wanted for item in self.buffer):
                return
            # Only an idle worker long-polls: while its jobs run, one finishing wakes
            # it, and a once worker (which stops when nothing is due) never polls.
            if self.wait_time > 0 and self.receipts.none_out() and not self._closed:
                for queue, url in urls:
                    if queue not in self._polling:
                        self._polling[queue] = _clock.monotonic()
                        thread = threading.Thread(
                            target=self._long_poll, args=(queue, url), name=f"rainier-sqs-poll-{queue}", daemon=True
                        )
                        self._poll_threads.add(thread)
                        thread.start()
            self._waiters.add(waker)
        try:
            waker.wait(timeout)
        finally:
            with self._lock:
                self._waiters.discard(waker)

    def _long_poll(self, queue: str, url: str) -> None:
        got: list[_Held] = []
        try:
            got = self._receive(queue, url, 1, self.wait_time)
        except Exception as exc:  # noqa: BLE001 - handed to the worker's next wait
            with self._lock:
                self._poll_error = exc
        with self._lock:
            self._polling.pop(queue, None)
            self._poll_threads.discard(threading.current_thread())
            closed = self._closed
            if not closed:
                self.buffer.extend(got)
            waiters = list(self._waiters)
        if closed and got:
            self._let_go(got)
        for waker in waiters:
            waker.set()

    def _let_go(self, items: Sequence[_Held]) -> None:
        """Hand back messages received but never handed out, as :meth:`give_back`
        does: the receives before this one were attempts (a run, or a worker that
        died) and stay counted; this one is not."""
        jobs: list[QueuedJob] = []
        unreadable: list[QueuedJob] = []
        for queue, message, receipt in items:
            received = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            try:
                job = wire.read(message.get("Body", ""), self.link.connection, receipt)
            except PayloadError:
                # The next receive discards it.
                unreadable.append(_placeholder(queue, receipt))
                continue
            job.attempts += max(1, received)
            jobs.append(job)
        try:
            self.give_back(jobs)
            if unreadable:
                self.link.receipt_batch("change_message_visibility_batch", unreadable, visible_now)
                self.receipts.settled(unreadable)
        except Exception as exc:  # noqa: BLE001 - they become visible when their timeout lapses anyway
            self.receipts.forget([receipt for _, _, receipt in items])
            log.warning("could not hand back %d held message(s): %s", len(items), exc)

    def close(self) -> bool:
        """Hand back messages a long poll brought in that no loop took, and
        wait (up to ``wait_time``) for the long polls still in flight: SQS hands
        a message arriving meanwhile to such a poll, and were the process gone
        by then it would stay hidden, and its receive would count as an attempt.
        False when it was closed already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            held, self.buffer = self.buffer, []
            polls = list(self._poll_threads)
        if held:
            self._let_go(held)
        deadline = _clock.monotonic() + self.wait_time + 2
        for thread in polls:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - _clock.monotonic()))  # each hands back what it got
        return True
