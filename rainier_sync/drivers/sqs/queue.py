"""The SQS driver: jobs as messages on Amazon SQS queues (boto3).

:class:`SqsQueue` stores jobs (``SendMessage(Batch)``) and composes the rest:
the consumer operations (:mod:`.consumer`), the failed queue
(:mod:`.failed`), the message format (:mod:`.wire`) and the calls to SQS
(:mod:`.client`). SQS has no failed-job table, so failed jobs go to a queue of
their own, ``failed_queue_url``, which this driver manages.
"""

from __future__ import annotations

import atexit
import math
import weakref
from typing import Any, Mapping, Sequence

from ... import _clock
from ..._checks import check_number
from ...errors import (
    ConfigurationError,
    DriverUnavailableError,
    SqsBatchError,
    SqsUnavailableError,
    UnknownQueueError,
)
from ...types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob
from ..base import BaseQueue, Capabilities, QueueDriver, Waker
from ..pushed import tell_pushed
from . import wire
from .client import SqsLink, boto3, build_clients, check_url, is_fifo, reaching, region_of
from .consumer import SqsConsumer
from .failed import SqsFailedQueue
from .spec import PROMISES

__all__ = ["SqsQueue", "UnknownQueueError", "SqsBatchError", "SqsUnavailableError"]


def _number(name: str, value: Any, low: float, high: float) -> float:
    return float(check_number(f"SqsQueue {name}", value, zero=True, least=low, most=high, unit="seconds"))


_OPEN: weakref.WeakSet[SqsQueue] = weakref.WeakSet()


@atexit.register
def _hand_back_at_exit() -> None:
    """Messages a long poll brought in go back when the process exits normally."""
    for queue in list(_OPEN):
        queue.close()


class SqsQueue(BaseQueue):
    """Jobs on Amazon SQS (or any server speaking its API).

    - ``queue_url``: the ``default`` queue's whole URL; ``queue_urls`` maps
      other queue names to theirs. A job for a queue with no URL is refused
      at dispatch.
    - ``failed_queue_url``: the queue failed jobs go to (required: SQS has no
      failed-job table, and a job that used up its attempts must go somewhere).
    - ``region`` (read from an AWS queue URL when omitted), ``endpoint`` (an
      SQS-compatible server), ``key``/``secret`` (both or neither; otherwise
      boto3's usual credential chain).
    - ``visibility_timeout``: the reservation, in seconds (default 30).
    - ``wait_time``: long polling while the worker is idle, 0 to 20 seconds
      (default 20; 0 turns it off).
    - ``timeout``: seconds a call waits to connect, and again for the answer
      (a long poll: ``wait_time`` more), default 5; a call tries three times,
      then raises :class:`SqsUnavailableError`.
    - ``client``: a boto3 SQS client to use instead of building one.
    """

    driver = QueueDriver.SQS
    promises = PROMISES
    capabilities = Capabilities(priority=False, give_back=True, wakes=True)

    def __init__(
        self,
        queue_url: str,
        *,
        queue_urls: Mapping[str, str] | None = None,
        region: str | None = None,
        endpoint: str | None = None,
        visibility_timeout: float | None = None,
        wait_time: float | None = None,
        key: str | None = None,
        secret: str | None = None,
        failed_queue_url: str | None = None,
        timeout: float | None = None,
        client: Any = None,
    ) -> None:
        if boto3 is None and client is None:
            raise DriverUnavailableError("the sqs driver needs boto3: pip install 'rainier_sync[sqs]'")
        urls: dict[str, str] = {"default": check_url("queue_url", queue_url)}
        for name, url in dict(queue_urls or {}).items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"SqsQueue queue_urls keys must be queue names, got {name!r}")
            check_url(f"queue_urls[{name!r}]", url)
            if name == "default" and url != queue_url:
                raise ConfigurationError(
                    "SqsQueue queue_urls['default'] differs from queue_url; queue_url is the default queue's URL"
                )
            urls[name] = url
        seen: dict[str, str] = {}
        for name, url in urls.items():
            if url in seen:
                raise ConfigurationError(
                    f"SqsQueue queues {seen[url]!r} and {name!r} share one URL; each queue needs its own SQS queue"
                )
            seen[url] = name
        if failed_queue_url is None:
            raise ConfigurationError(
                "SqsQueue needs failed_queue_url: SQS has no failed-job table, so jobs that use up their "
                "attempts go to an SQS queue you name (a dead-letter queue); without one they would be lost"
            )
        check_url("failed_queue_url", failed_queue_url)
        if failed_queue_url in seen:
            raise ConfigurationError(
                f"SqsQueue failed_queue_url is also the URL of queue {seen[failed_queue_url]!r}; "
                "failed jobs need a queue of their own"
            )
        if (key is None) != (secret is None):
            raise ConfigurationError(
                "SqsQueue takes key and secret together: "
                + ("key was given without secret" if key is not None else "secret was given without key")
            )
        self.reservation: float = float(
            math.ceil(_number("visibility_timeout", 30 if visibility_timeout is None else visibility_timeout, 1, 43200))
        )
        self.wait_time: int = int(_number("wait_time", 20 if wait_time is None else wait_time, 0, 20))
        self.timeout: float = _number("timeout", 5 if timeout is None else timeout, 0.1, 300)
        if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))):
            raise ConfigurationError(f"SqsQueue endpoint must be an http(s) URL, got {endpoint!r}")
        self.queue_urls: dict[str, str] = urls
        if any(is_fifo(url) for url in urls.values()):
            # A FIFO queue's hand-back keeps its group's order, and so counts the receive.
            self.capabilities = Capabilities(priority=False, give_back=False, wakes=True)
        self.failed_queue_url: str = failed_queue_url
        self.endpoint = endpoint
        if client is not None:
            if key is not None or endpoint is not None or region is not None or timeout is not None:
                raise ConfigurationError(
                    "SqsQueue takes either client, or region/endpoint/key/secret/timeout to build one"
                )
            self.client = client
            self._poll_client = client
            self._owns_client = False
            self.region: str | None = getattr(getattr(client, "meta", None), "region_name", None)
        else:
            self.region = region or region_of(queue_url)
            self.client, self._poll_client, self.region = build_clients(
                key=key,
                secret=secret,
                region=self.region,
                endpoint=endpoint,
                timeout=self.timeout,
                wait_time=self.wait_time,
                queues=len(urls),
            )
            self._owns_client = True
        self.link = SqsLink(
            self,
            client=self.client,
            poll_client=self._poll_client,
            queue_urls=urls,
            failed_queue_url=failed_queue_url,
            endpoint=endpoint,
            timeout=self.timeout,
        )
        self.failed = SqsFailedQueue(self.link)
        self.consumer = SqsConsumer(self.link, self.failed, reservation=self.reservation, wait_time=self.wait_time)
        _OPEN.add(self)

    def url_of(self, queue: str) -> str:
        """The SQS URL of ``queue``; :class:`UnknownQueueError` when it has none."""
        return self.link.url_of(queue)

    @property
    def _buffer(self) -> list[tuple[str, dict[str, Any], Any]]:
        """Messages a long poll brought in that no loop took yet."""
        return self.consumer.buffer

    # -- producing ----------------------------------------------------------------------
    def check(self, job: QueuedJob) -> None:
        """A queue with no URL (:class:`UnknownQueueError`), a body over SQS's size
        limit, a delay on a FIFO queue (:class:`~rainier_sync.errors.PayloadError`)."""
        wire.entry(job, self.url_of(job.queue), _clock.now())

    @reaching("dispatch a job", serving=True)
    def push(self, job: QueuedJob) -> str:
        url = self.url_of(job.queue)
        entry = wire.entry(job, url, _clock.now())
        try:
            self.client.send_message(QueueUrl=url, **entry)
        except Exception as exc:
            exc.add_note(f"while sending job {job.id} ({job.name}) to queue {job.queue!r} at {url}")
            raise
        return job.id

    @reaching("dispatch jobs", serving=True)
    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """``SendMessageBatch``, ten per call; entries SQS refuses for a passing
        reason are retried, and any still refused raise :class:`SqsBatchError`.
        A call that fails leaves the jobs sent before it on the error
        (:func:`~rainier_sync.drivers.pushed.pushed_before`)."""
        now = _clock.now()
        by_url: dict[str, list[tuple[QueuedJob, dict[str, Any]]]] = {}
        for job in jobs:  # check everything before sending anything
            url = self.url_of(job.queue)
            by_url.setdefault(url, []).append((job, wire.entry(job, url, now)))
        done: list[str] = []
        failed: dict[str, str] = {}
        sender_fault: set[str] = set()
        for url, items in by_url.items():
            for batch in wire.size_batches(items):
                try:
                    ok, bad, theirs = self.link.send_batch(url, batch)
                except Exception as exc:
                    exc.add_note(
                        f"while sending {len(batch)} job(s) to queue {batch[0][0].queue!r} at {url}; "
                        f"already sent: {', '.join(done) or 'none'}"
                    )
                    tell_pushed(exc, done, {i: failed[i] for i in sender_fault})
                    raise
                done.extend(job.id for job in ok)
                failed.update(bad)
                sender_fault |= theirs
        if failed:
            error = SqsBatchError("SendMessageBatch", done, failed, sender_fault=sender_fault)
            raise tell_pushed(error, done, {i: failed[i] for i in sender_fault})
        return [job.id for job in jobs]

    # -- consuming: the consumer's ----------------------------------------------------------
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self.consumer.reserve_many(queues, limit)

    def acknowledge(self, job: QueuedJob) -> None:
        self.consumer.acknowledge(job)

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        self.consumer.acknowledge_many(jobs)

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self.consumer.release(job, delay)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        self.consumer.give_back(jobs)

    def defer(self, job: QueuedJob, delay: float) -> None:
        self.consumer.defer(job, delay)

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        return self.consumer.fail(job, error)

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        self.consumer.extend(jobs, seconds)

    def reclaim_expired(self) -> int:
        return self.consumer.reclaim_expired()

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        self.consumer.wait_for_jobs(queues, timeout, waker)

    # -- the failed store: the failed queue's ------------------------------------------------
    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        return self.failed.failed_jobs(limit)

    def failed_count(self) -> int:
        return self.failed.failed_count()

    def retry_failed(self, id: str) -> bool:
        return self.failed.retry_failed(id)

    def forget_failed(self, id: str) -> bool:
        return self.failed.forget_failed(id)

    # -- inspection ------------------------------------------------------------------------------
    @reaching("count jobs")
    def counts(self, queue: str) -> QueueCounts:
        """From the queue's approximate attributes: ``reserved`` also holds jobs
        released with a backoff (SQS cannot tell the two apart)."""
        counts = self.link.attributes(self.url_of(queue))
        return QueueCounts(
            ready=counts["ApproximateNumberOfMessages"],
            delayed=counts["ApproximateNumberOfMessagesDelayed"],
            reserved=counts["ApproximateNumberOfMessagesNotVisible"],
        )

    @reaching("count jobs")
    def size(self, queue: str | None = None) -> int:
        """Jobs on ``queue`` (every queue when None): ready, delayed and reserved; approximate."""
        names = sorted(self.queue_urls) if queue is None else [queue]
        return sum(self.counts(name).total for name in names)

    def queue_names(self) -> list[str]:
        return sorted(self.queue_urls)

    def close(self) -> None:
        """Hand back messages a long poll brought in that no worker took, wait
        for the long polls still in flight (see :meth:`SqsConsumer.close`), and
        close the clients this driver built."""
        _OPEN.discard(self)
        if self.consumer.close() and self._owns_client:
            self.client.close()
            self._poll_client.close()

    def describe(self) -> str:
        return f"sqs {self.queue_urls['default']}"

    def __repr__(self) -> str:
        return (
            f"<SqsQueue default={self.queue_urls['default']!r} queues={sorted(self.queue_urls)} "
            f"region={self.region!r} visibility_timeout={self.reservation:g}>"
        )
