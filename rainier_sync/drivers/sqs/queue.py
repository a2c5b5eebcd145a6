"""The SQS driver: jobs as messages on Amazon SQS queues (boto3).

Reserve is ``ReceiveMessage`` (the message's visibility timeout is the
reservation), acknowledge is ``DeleteMessage(Batch)``, release is
``ChangeMessageVisibility``. SQS has no failed-job table, so failed jobs go to
a queue of their own, ``failed_queue_url``, which this driver manages.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib
import logging
import math
import threading
import uuid
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast
from urllib.parse import urlsplit

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from ... import _clock, signals
from ...errors import (
    ConfigurationError,
    DriverUnavailableError,
    PayloadError,
    SqsBatchError,
    SqsUnavailableError,
    UnknownQueueError,
)
from ...types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob, as_exception_info, decode, encode
from ..base import BaseQueue, Capabilities, QueueDriver, Waker, as_job_list

boto3: Any
_BotoConfig: Any
#: botocore's errors for a server it could not reach: refused, timed out, cut off.
_UNREACHABLE: tuple[type[Exception], ...] = ()
try:
    boto3 = importlib.import_module("boto3")
    _BotoConfig = importlib.import_module("botocore.config").Config
    _botocore_errors = importlib.import_module("botocore.exceptions")
    _UNREACHABLE = (_botocore_errors.ConnectionError, _botocore_errors.HTTPClientError)
except ImportError:  # pragma: no cover - exercised only without the extra
    boto3 = None
    _BotoConfig = None

__all__ = ["SqsQueue", "UnknownQueueError", "SqsBatchError", "SqsUnavailableError"]

log = logging.getLogger("rainier_sync")

#: SQS's longest per-message delay; longer delays hop (re-send with what is left).
MAX_DELAY = 900
#: SQS's largest message, and largest batch (the sum of its entries).
MAX_MESSAGE_BYTES = 1_048_576
#: ChangeMessageVisibility stays below SQS's 12-hour ceiling.
MAX_VISIBILITY = 43_000
#: Failed-store entries one listing looks at, at most.
SCAN_LIMIT = 1_000
_BATCH = 10
#: Tries of one call (the first and two retries) before it raises.
_TRIES = 3
_FAILED_MARK = "rainier_failed"
_SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp"]


class _RetryableEntries(Exception):
    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__(failed)
        self.failed = failed


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _reaching(action: str) -> Callable[[_Method], _Method]:
    """Raise :class:`SqsUnavailableError` for a server the call could not reach."""

    def decorate(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: SqsQueue, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except _UNREACHABLE as exc:
                raise self._unreachable(action, exc) from exc

        return cast(_Method, call)

    return decorate


@dataclass(slots=True, frozen=True)
class _Receipt:
    """Where a received message came from and the handle to settle it with."""

    queue: str
    url: str
    handle: str
    message_id: str
    received_at: float


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise ConfigurationError(f"SqsQueue {name} must be a number of seconds from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _check_url(name: str, url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or not urlsplit(url).path.strip("/"):
        raise ConfigurationError(
            f"SqsQueue {name} must be a queue's whole URL "
            f"(https://sqs.<region>.amazonaws.com/<account>/<queue name>), got {url!r}"
        )
    return url


def _region_of(url: str) -> str | None:
    host = urlsplit(url).hostname or ""
    if not host.endswith(".amazonaws.com"):
        return None
    parts = host.split(".")
    if parts[0] == "sqs" and len(parts) > 3:
        return parts[1]
    if len(parts) > 3 and parts[1] == "queue":
        return parts[0]
    return None


def _is_fifo(url: str) -> bool:
    return url.rstrip("/").endswith(".fifo")


def _chunks(items: Sequence[Any], size: int = _BATCH) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _attributes_param(client: Any) -> str:
    """Newer botocore names ReceiveMessage's system attributes
    ``MessageSystemAttributeNames``; older releases only know ``AttributeNames``."""
    try:
        members = client.meta.service_model.operation_model("ReceiveMessage").input_shape.members
    except Exception:  # noqa: BLE001 - a client without a service model: assume the current name
        return "MessageSystemAttributeNames"
    return "MessageSystemAttributeNames" if "MessageSystemAttributeNames" in members else "AttributeNames"


_OPEN: weakref.WeakSet[SqsQueue] = weakref.WeakSet()


@atexit.register
def _hand_back_at_exit() -> None:
    """Messages a long poll brought in go back when the process exits normally."""
    for queue in list(_OPEN):
        queue.close()


_STALE_CODES = {"ReceiptHandleIsInvalid", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight"}


def _stale_receipt(exc: Exception) -> bool:
    """SQS's answer when a receipt no longer holds its message: the message is
    gone, or its reservation lapsed and another receive took it."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    code, message = str(error.get("Code", "")), str(error.get("Message", "")).lower()
    return code in _STALE_CODES or (code == "InvalidParameterValue" and "receipthandle" in message.replace(" ", ""))


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
        urls: dict[str, str] = {"default": _check_url("queue_url", queue_url)}
        for name, url in dict(queue_urls or {}).items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"SqsQueue queue_urls keys must be queue names, got {name!r}")
            _check_url(f"queue_urls[{name!r}]", url)
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
        _check_url("failed_queue_url", failed_queue_url)
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
        if any(_is_fifo(url) for url in urls.values()):
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
            self.region = region or _region_of(queue_url)
            self.client, self._poll_client = self._build_clients(key, secret)
            self._owns_client = True
        self._attributes_param = _attributes_param(self.client)
        self._lock = threading.Lock()
        self._buffer: list[tuple[str, dict[str, Any], _Receipt]] = []
        self._polling: dict[str, float] = {}  # queue -> when its long poll started (monotonic)
        self._outstanding: set[str] = set()  # message ids handed out and not settled yet
        # receipt handle -> when its reservation lapses (monotonic), by our own reckoning
        self._deadlines: dict[str, float] = {}
        # receipt handles whose later copy or failed entry went out and whose
        # delete did not yet: a repeated release() or fail() sends it once
        self._copied: set[str] = set()
        # message ids hopped whose original was not deleted yet: it comes back,
        # and then it is only deleted (its copy went out already)
        self._hopped: set[str] = set()
        self._poll_threads: set[threading.Thread] = set()
        self._poll_error: BaseException | None = None
        self._waiters: set[Waker] = set()
        self._closed = False
        _OPEN.add(self)

    def _build_clients(self, key: str | None, secret: str | None) -> tuple[Any, Any]:
        """A client for every call, and one for long polls, whose answer takes
        up to ``wait_time`` longer (a frozen endpoint must not hold a dispatch
        that long)."""
        assert boto3 is not None and _BotoConfig is not None
        session = boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret, region_name=self.region)
        if session.region_name is None:
            raise ConfigurationError(
                "SqsQueue needs a region: pass region=... (or set AWS_DEFAULT_REGION); "
                "it could not be read from queue_url"
            )
        self.region = session.region_name
        retries = {"total_max_attempts": _TRIES, "mode": "standard"}
        calls = _BotoConfig(
            retries=retries, connect_timeout=self.timeout, read_timeout=self.timeout, max_pool_connections=20
        )
        polls = _BotoConfig(
            retries=retries,
            connect_timeout=self.timeout,
            read_timeout=self.wait_time + self.timeout,
            max_pool_connections=max(10, len(self.queue_urls)),
        )
        return (
            session.client("sqs", endpoint_url=self.endpoint, config=calls),
            session.client("sqs", endpoint_url=self.endpoint, config=polls),
        )

    # -- helpers ----------------------------------------------------------------------
    def _unreachable(self, action: str, exc: Exception) -> SqsUnavailableError:
        where = self.endpoint or getattr(getattr(self.client, "meta", None), "endpoint_url", None) or "SQS"
        error = SqsUnavailableError(
            f"SQS connection {self.connection!r} could not reach {where} to {action} "
            f"({_TRIES} tries, {self.timeout:g} s each to connect and to answer): {exc}"
        )
        for note in getattr(exc, "__notes__", ()):
            error.add_note(note)
        return error

    def url_of(self, queue: str) -> str:
        """The SQS URL of ``queue``; :class:`UnknownQueueError` when it has none."""
        url = self.queue_urls.get(queue)
        if url is None:
            known = ", ".join(sorted(self.queue_urls))
            raise UnknownQueueError(
                f"queue {queue!r} has no SQS URL on connection {self.connection!r} (queues with one: {known}); "
                "add it to queue_urls"
            )
        return url

    def _body(self, job: QueuedJob) -> str:
        body = job.encode()
        if len(body.encode()) > MAX_MESSAGE_BYTES:
            raise PayloadError(
                f"job {job.name!r} ({job.id}) is {len(body.encode())} bytes as JSON; SQS takes at most "
                f"{MAX_MESSAGE_BYTES}: pass a reference (a key, an id) instead of the data"
            )
        return body

    def _entry(self, job: QueuedJob, url: str, now: float, *, fresh_dedup: bool = False) -> dict[str, Any]:
        """One SendMessage(Batch) entry for ``job``, its delay capped at SQS's 15 minutes."""
        entry: dict[str, Any] = {"MessageBody": self._body(job)}
        wait = job.available_at - now
        if _is_fifo(url):
            if wait > 0:
                raise ValueError(
                    f"job {job.name!r} ({job.id}) has a delay, but queue {job.queue!r} is a FIFO queue, "
                    "and SQS FIFO queues take no per-message delay"
                )
            entry["MessageGroupId"] = job.name
            if job.unique_key is not None and not fresh_dedup:
                entry["MessageDeduplicationId"] = hashlib.sha256(job.unique_key.encode()).hexdigest()
            else:
                entry["MessageDeduplicationId"] = job.id if not fresh_dedup else uuid.uuid4().hex
        elif wait > 0:
            entry["DelaySeconds"] = min(MAX_DELAY, math.ceil(wait))
        return entry

    # -- producing ----------------------------------------------------------------------
    @_reaching("dispatch a job")
    def push(self, job: QueuedJob) -> str:
        url = self.url_of(job.queue)
        entry = self._entry(job, url, _clock.now())
        try:
            self.client.send_message(QueueUrl=url, **entry)
        except Exception as exc:
            exc.add_note(f"while sending job {job.id} ({job.name}) to queue {job.queue!r} at {url}")
            raise
        return job.id

    @_reaching("dispatch jobs")
    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """``SendMessageBatch``, ten per call; entries SQS refuses for a passing
        reason are retried, and any still refused raise :class:`SqsBatchError`."""
        now = _clock.now()
        by_url: dict[str, list[tuple[QueuedJob, dict[str, Any]]]] = {}
        for job in jobs:  # check everything before sending anything
            url = self.url_of(job.queue)
            by_url.setdefault(url, []).append((job, self._entry(job, url, now)))
        done: list[str] = []
        failed: dict[str, str] = {}
        for url, items in by_url.items():
            for batch in self._size_batches(items):
                try:
                    ok, bad = self._send_batch(url, batch)
                except Exception as exc:
                    exc.add_note(
                        f"while sending {len(batch)} job(s) to queue {batch[0][0].queue!r} at {url}; "
                        f"already sent: {', '.join(done) or 'none'}"
                    )
                    raise
                done.extend(job.id for job in ok)
                failed.update(bad)
        if failed:
            raise SqsBatchError("SendMessageBatch", done, failed)
        return [job.id for job in jobs]

    @staticmethod
    def _size_batches(
        items: list[tuple[QueuedJob, dict[str, Any]]],
    ) -> list[list[tuple[QueuedJob, dict[str, Any]]]]:
        batches: list[list[tuple[QueuedJob, dict[str, Any]]]] = []
        current: list[tuple[QueuedJob, dict[str, Any]]] = []
        size = 0
        for item in items:
            length = len(item[1]["MessageBody"].encode())
            if current and (len(current) == _BATCH or size + length > MAX_MESSAGE_BYTES):
                batches.append(current)
                current, size = [], 0
            current.append(item)
            size += length
        if current:
            batches.append(current)
        return batches

    def _send_batch(
        self, url: str, batch: Sequence[tuple[QueuedJob, dict[str, Any]]]
    ) -> tuple[list[QueuedJob], dict[str, str]]:
        """One ``SendMessageBatch`` (ten at most), its passing failures retried:
        the jobs sent, and SQS's reason by job id for those that were not."""
        pending = {str(i): item for i, item in enumerate(batch)}
        done: list[QueuedJob] = []
        final: dict[str, str] = {}

        def attempt() -> None:
            entries = [{"Id": key, **entry} for key, (_, entry) in pending.items()]
            response = self.client.send_message_batch(QueueUrl=url, Entries=entries)
            for ok in response.get("Successful", []):
                job, _ = pending.pop(ok["Id"])
                done.append(job)
            retry: dict[str, str] = {}
            for bad in response.get("Failed", []):
                reason = f"{bad.get('Code', 'Error')}: {bad.get('Message', '')}".rstrip(": ")
                if bad.get("SenderFault"):
                    job, _ = pending.pop(bad["Id"])
                    final[job.id] = reason
                else:
                    retry[pending[bad["Id"]][0].id] = reason
            if retry:
                raise _RetryableEntries(retry)

        try:
            for attempt_state in Retrying(
                retry=retry_if_exception_type(_RetryableEntries),
                stop=stop_after_attempt(4),
                wait=wait_exponential(multiplier=0.05, max=1.0),
                reraise=True,
            ):
                with attempt_state:
                    attempt()
        except _RetryableEntries as exc:
            final.update(exc.failed)
        return done, final

    # -- consuming ------------------------------------------------------------------------
    def _receive(self, queue: str, url: str, count: int, wait: int = 0) -> list[tuple[str, dict[str, Any], _Receipt]]:
        start = _clock.monotonic()
        response = (self._poll_client if wait else self.client).receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=count,
            VisibilityTimeout=int(self.reservation),
            WaitTimeSeconds=wait,
            **{self._attributes_param: _SYSTEM_ATTRIBUTES},
        )
        at = _clock.monotonic()
        received = [
            (queue, message, _Receipt(queue, url, message["ReceiptHandle"], message["MessageId"], at))
            for message in response.get("Messages", [])
        ]
        if received:
            # The visibility started when SQS answered, a little before the answer
            # arrived (a long poll waits first); never before the request went out.
            deadline = max(start, at - min(1.0, self.reservation / 10)) + self.reservation
            with self._lock:
                for _, _, receipt in received:
                    self._deadlines[receipt.handle] = deadline
        return received

    def _lapsed(self, job: QueuedJob) -> bool:
        """Whether ``job``'s reservation has run out by our reckoning (received
        plus the visibility timeout, moved on by each extend): SQS may have
        handed its message to another worker since."""
        receipt = job.receipt
        if not isinstance(receipt, _Receipt):
            return False
        with self._lock:
            deadline = self._deadlines.get(receipt.handle)
        return deadline is not None and _clock.monotonic() >= deadline

    def _forget_receipts(self, receipts: Sequence[_Receipt]) -> None:
        with self._lock:
            for receipt in receipts:
                self._deadlines.pop(receipt.handle, None)

    @_reaching("receive jobs")
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """``ReceiveMessage`` (up to ten per call), trying ``queues`` in order; a
        queue is left for the next only when it answered with nothing."""
        urls = [(queue, self.url_of(queue)) for queue in queues]
        if limit <= 0:
            return []
        taken = self._take_held(urls, limit)
        if taken:
            return self._handed_out(taken)
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
                fifo = _is_fifo(url)
                while len(taken) < limit:
                    # FIFO: one at a time, so two jobs of one message group never run side by side.
                    want = 1 if fifo else min(_BATCH, limit - len(taken))
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
            info = ExceptionInfo.from_exception(exc)
            log.warning("a receive failed after %d job(s) were taken; handing those out: %s", len(taken), info.error)
            signals.emit(
                signals.queue_operation_failed,
                self,
                connection=self.connection,
                operation="reserve",
                error=info.error,
                exception=info,
            )
            return self._handed_out(taken)
        # A long poll may have landed a message while we looked.
        return self._handed_out(taken or self._take_held(urls, limit))

    def _handed_out(self, jobs: list[QueuedJob]) -> list[QueuedJob]:
        with self._lock:
            self._outstanding.update(job.receipt.message_id for job in jobs)
        return jobs

    def _settled(self, jobs: Sequence[QueuedJob]) -> None:
        with self._lock:
            for job in jobs:
                if isinstance(job.receipt, _Receipt):
                    self._outstanding.discard(job.receipt.message_id)
                    self._deadlines.pop(job.receipt.handle, None)
                    self._copied.discard(job.receipt.handle)

    def _take_held(self, urls: Sequence[tuple[str, str]], limit: int) -> list[QueuedJob]:
        """Jobs from messages a long poll brought in, in queue order."""
        order = {queue: index for index, (queue, _) in enumerate(urls)}
        with self._lock:
            # Only messages of the queues asked for: another worker on this
            # connection may be waiting on others.
            held = [item for item in self._buffer if item[0] in order]
            self._buffer = [item for item in self._buffer if item[0] not in order]
        if not held:
            return []
        # Less than half the reservation left (heartbeats renew held messages
        # too): its visibility may lapse while it runs, and SQS hands it out again.
        fresh_until = _clock.monotonic() + self.reservation / 2
        with self._lock:
            deadlines = {item[2].handle: self._deadlines.get(item[2].handle) for item in held}
        held.sort(key=lambda item: order.get(item[0], len(order)))
        taken: list[QueuedJob] = []
        for index, item in enumerate(held):
            if len(taken) >= limit:
                with self._lock:
                    self._buffer[:0] = held[index:]
                break
            deadline = deadlines[item[2].handle]
            if (item[2].received_at + self.reservation if deadline is None else deadline) < fresh_until:
                self._forget_receipts([item[2]])
                continue  # held too long: its visibility may lapse, and SQS hands it out again
            job = self._accept_safely(*item)
            if job is not None:
                taken.append(job)
        return taken

    def _accept_safely(self, queue: str, message: dict[str, Any], receipt: _Receipt) -> QueuedJob | None:
        """:meth:`_accept`, where a failure to hop, discard or fail one message
        is reported and leaves it to reappear, without costing the others."""
        try:
            job = self._accept(queue, message, receipt)
            if job is None:
                self._forget_receipts([receipt])
            return job
        except Exception as exc:  # noqa: BLE001 - the message stays on SQS; its visibility lapses
            self._forget_receipts([receipt])
            info = ExceptionInfo.from_exception(exc)
            log.error("handling message %s from queue %r failed: %s", receipt.message_id, queue, info.error)
            signals.emit(
                signals.queue_operation_failed,
                self,
                connection=self.connection,
                operation="reserve",
                error=info.error,
                exception=info,
            )
            return None

    def _accept(self, queue: str, message: dict[str, Any], receipt: _Receipt) -> QueuedJob | None:
        """The job a received message carries, or None when it was handled here:
        unreadable (discarded to the failed store) or not due yet (hopped)."""
        body = message.get("Body", "")
        try:
            job = self._read(body, receipt)
        except PayloadError as exc:
            self._discard(queue, body, receipt, exc)
            return None
        remaining = job.available_at - _clock.now()
        if remaining > 0 and not _is_fifo(receipt.url):
            self._hop(job, remaining)
            return None
        received = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        # The body counts attempts made before this message was sent; SQS counts
        # the receives since, including those whose worker died mid-attempt. A job
        # past its last attempt is handed out too: the executor fails it as lost.
        job.attempts += max(1, received)
        return job

    def _read(self, body: str, receipt: _Receipt | None = None) -> QueuedJob:
        """The job a message's body carries; :class:`PayloadError` saying why for
        anything that is not one (any exception while decoding it: not JSON,
        nested too deep to parse, missing fields, an attempt count that is
        negative or absurd, a time that is not a number)."""
        try:
            job = QueuedJob.decode(body, connection=self.connection, receipt=receipt)
        except PayloadError:
            raise
        except Exception as exc:  # whatever else decoding one message raises costs only that message
            raise PayloadError(f"a queued job could not be read: {type(exc).__name__}: {exc}") from exc
        return job

    def _hop(self, job: QueuedJob, remaining: float) -> None:
        """Re-send a job whose delay outlasts SQS's 15 minutes with what is left."""
        receipt: _Receipt = job.receipt
        url = receipt.url
        with self._lock:
            sent = receipt.message_id in self._hopped
        if not sent:
            entry = self._entry(replace(job, receipt=None), url, _clock.now())
            if "DelaySeconds" not in entry:
                entry["DelaySeconds"] = min(MAX_DELAY, max(1, math.ceil(remaining)))
            self.client.send_message(QueueUrl=url, **entry)
            with self._lock:
                self._hopped.add(receipt.message_id)
        self.client.delete_message(QueueUrl=url, ReceiptHandle=receipt.handle)
        with self._lock:
            self._hopped.discard(receipt.message_id)

    def _discard(self, queue: str, body: str, receipt: _Receipt, exc: Exception) -> None:
        info = ExceptionInfo.from_exception(exc)
        log.error(
            "discarded message %s from queue %r on connection %r into the failed store: %s",
            receipt.message_id,
            queue,
            self.connection,
            info.error,
        )
        entry = {
            _FAILED_MARK: 1,
            "raw": body,
            "queue": queue,
            "message_id": receipt.message_id,
            "error": info.to_dict(),
            "failed_at": _clock.now(),
        }
        self._send_failed(encode(entry))
        self.client.delete_message(QueueUrl=receipt.url, ReceiptHandle=receipt.handle)
        self.announce_discarded(info, body)

    def _on_receipt(self, operation: str, job: QueuedJob, method: str, **params: Any) -> None:
        """Call ``method`` with ``job``'s receipt; a receipt that no longer holds
        the message is logged, not raised (the worker would retry it forever)."""
        receipt: _Receipt | None = job.receipt
        if receipt is None:
            return
        try:
            getattr(self.client, method)(QueueUrl=receipt.url, ReceiptHandle=receipt.handle, **params)
        except Exception as exc:
            if not _stale_receipt(exc):
                raise
            log.warning(
                "could not %s job %s (%s): its message is gone, or its reservation lapsed and another "
                "receive holds it now (%s)",
                operation,
                job.id,
                job.name,
                exc,
            )

    @_reaching("delete a finished job")
    def acknowledge(self, job: QueuedJob) -> None:
        self._on_receipt("acknowledge", job, "delete_message")
        self._settled([job])

    @_reaching("delete finished jobs")
    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        """``DeleteMessageBatch``, ten per call."""
        self._batch("delete_message_batch", jobs, lambda receipt: {"ReceiptHandle": receipt.handle})
        self._settled(jobs)

    def _batch(self, method: str, jobs: Sequence[QueuedJob], entry: Any) -> list[QueuedJob]:
        """Run a receipt batch call per queue URL; an entry SQS refuses as the
        sender's fault (a stale receipt) is logged, anything else raises."""
        by_url: dict[str, list[QueuedJob]] = {}
        for job in jobs:
            if isinstance(job.receipt, _Receipt):
                by_url.setdefault(job.receipt.url, []).append(job)
        call = getattr(self.client, method)
        problems: dict[str, str] = {}
        done: list[str] = []
        through: list[QueuedJob] = []
        for url, group in by_url.items():
            for chunk in _chunks(group):
                response = call(
                    QueueUrl=url, Entries=[{"Id": str(i), **entry(job.receipt)} for i, job in enumerate(chunk)]
                )
                through.extend(chunk[int(ok["Id"])] for ok in response.get("Successful", []))
                done.extend(chunk[int(ok["Id"])].id for ok in response.get("Successful", []))
                for bad in response.get("Failed", []):
                    job = chunk[int(bad["Id"])]
                    reason = f"{bad.get('Code', 'Error')}: {bad.get('Message', '')}"
                    if bad.get("SenderFault"):
                        log.warning("%s for job %s (%s) refused: %s", method, job.id, job.name, reason)
                    else:
                        problems[job.id] = reason
        if problems:
            raise SqsBatchError(method, done, problems)
        return through

    @_reaching("release a job")
    def release(self, job: QueuedJob, delay: float = 0) -> None:
        """``ChangeMessageVisibility`` to the delay (0: at once); a delay past 15
        minutes re-sends the job with it instead."""
        receipt: _Receipt | None = job.receipt
        if receipt is None:
            return
        if self._lapsed(job):
            # Its message is visible again, or another worker runs it: changing
            # it (or sending a later copy) would hide or duplicate that run.
            log.warning(
                "job %s (%s) not released: its reservation lapsed, so SQS delivers it again and that "
                "receive counts this attempt",
                job.id,
                job.name,
            )
            self._settled([job])
            return
        wait = max(0.0, float(delay))
        if wait <= MAX_DELAY or _is_fifo(receipt.url):
            visibility = min(MAX_VISIBILITY, math.ceil(wait))
            self._on_receipt("release", job, "change_message_visibility", VisibilityTimeout=visibility)
            self._settled([job])
            return
        if not self._was_copied(receipt):
            later = replace(job, receipt=None, available_at=_clock.now() + wait)
            self.client.send_message(QueueUrl=receipt.url, **self._entry(later, receipt.url, _clock.now()))
            self._mark_copied(receipt)
        self._on_receipt("release", job, "delete_message")
        self._settled([job])

    @_reaching("hand jobs back")
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
            if not isinstance(job.receipt, _Receipt):
                continue
            if self._lapsed(job):
                # Another receive may hold it now: a copy would run beside it.
                log.warning(
                    "job %s (%s) not handed back: its reservation lapsed, so SQS delivers it again and "
                    "that receive counts as an attempt",
                    job.id,
                    job.name,
                )
                self._settled([job])
                continue
            (fifo if _is_fifo(job.receipt.url) else standard).append(job)
        if standard:
            self._copy_back(standard)
        if fifo:
            self._batch(
                "change_message_visibility_batch",
                fifo,
                lambda receipt: {"ReceiptHandle": receipt.handle, "VisibilityTimeout": 0},
            )
            self._settled(fifo)

    def _copy_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Send each job again with the attempts before its receive, then delete
        the received messages (copies first: a crash between the two leaves a
        job twice, never nowhere)."""
        now = _clock.now()
        by_url: dict[str, list[tuple[QueuedJob, dict[str, Any]]]] = {}
        for job in jobs:
            receipt: _Receipt = job.receipt
            if not self._was_copied(receipt):
                copy = replace(job, receipt=None, attempts=max(0, job.attempts - 1))
                by_url.setdefault(receipt.url, []).append((job, self._entry(copy, receipt.url, now)))
        refused: dict[str, str] = {}
        for url, items in by_url.items():
            for batch in self._size_batches(items):
                sent, bad = self._send_batch(url, batch)
                for job in sent:
                    self._mark_copied(job.receipt)
                refused.update(bad)
        if refused:
            # Nothing is deleted until every copy is out; a repeat sends only the missing ones.
            raise SqsBatchError("SendMessageBatch", [j.id for j in jobs if self._was_copied(j.receipt)], refused)
        self._batch("delete_message_batch", jobs, lambda receipt: {"ReceiptHandle": receipt.handle})
        self._settled(jobs)

    @_reaching("fail a job")
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
            self._settled([job])
            return FailedJob.of(plain, info, failed_at)
        if not (isinstance(job.receipt, _Receipt) and self._was_copied(job.receipt)):
            entry = {_FAILED_MARK: 1, "job": plain.to_wire(), "error": info.to_dict(), "failed_at": failed_at}
            self._send_failed(encode(entry))
            if isinstance(job.receipt, _Receipt):
                self._mark_copied(job.receipt)
        self._on_receipt("fail", job, "delete_message")
        self._settled([job])
        return FailedJob.of(plain, info, failed_at)

    def _was_copied(self, receipt: _Receipt) -> bool:
        with self._lock:
            return receipt.handle in self._copied

    def _mark_copied(self, receipt: _Receipt) -> None:
        with self._lock:
            self._copied.add(receipt.handle)

    def _send_failed(self, body: str) -> None:
        extra: dict[str, Any] = {}
        if _is_fifo(self.failed_queue_url):
            extra = {"MessageGroupId": "rainier-failed", "MessageDeduplicationId": uuid.uuid4().hex}
        if len(body.encode()) > MAX_MESSAGE_BYTES:
            # The traceback is what makes an entry too big; keep the job, trim the story.
            data = decode(body)
            data["error"]["traceback"] = data["error"].get("traceback", "")[-4000:]
            body = encode(data)
            if len(body.encode()) > MAX_MESSAGE_BYTES and isinstance(data.get("raw"), str):
                # An unreadable message near SQS's size limit, escaped: keep its beginning.
                raw: str = data["raw"]
                data["raw_length"] = len(raw)
                keep = len(raw)
                while keep and len(body.encode()) > MAX_MESSAGE_BYTES:
                    keep = keep * 9 // 10
                    data["raw"] = raw[:keep]
                    body = encode(data)
        self.client.send_message(QueueUrl=self.failed_queue_url, MessageBody=body, **extra)

    @_reaching("renew reservations")
    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        """``ChangeMessageVisibilityBatch`` for running jobs (and messages a long
        poll brought in that no thread has taken yet)."""
        timeout = min(MAX_VISIBILITY, math.ceil(self.reservation if seconds is None else seconds))
        targets = as_job_list(jobs)
        # A held message nobody took for a while (its queue's worker stopped, or
        # is busy) goes back to its queue rather than being renewed for ever.
        cutoff = _clock.monotonic() - 2 * self.reservation - self.wait_time
        with self._lock:
            old = [item for item in self._buffer if item[2].received_at < cutoff]
            if old:
                self._buffer = [item for item in self._buffer if item[2].received_at >= cutoff]
            held = [
                QueuedJob(id=receipt.message_id, name="(held)", queue=queue, payload={}, receipt=receipt)
                for queue, _, receipt in self._buffer
            ]
        if old:
            self._let_go(old)
        start = _clock.monotonic()
        extended = self._batch(
            "change_message_visibility_batch",
            [job for job in targets if not self._lapsed(job)] + held,
            lambda receipt: {"ReceiptHandle": receipt.handle, "VisibilityTimeout": timeout},
        )
        with self._lock:
            for job in extended:
                if job.receipt.handle in self._deadlines:
                    self._deadlines[job.receipt.handle] = start + timeout

    def reclaim_expired(self) -> int:
        """SQS itself makes a message visible again when its reservation lapses; 0."""
        return 0

    # -- the failed store -------------------------------------------------------------------
    def _scan_failed(self) -> list[tuple[FailedJob, str]]:
        """Receive the failed queue's entries (hidden for 30 s while we look),
        up to :data:`SCAN_LIMIT`; with their receipt handles."""
        expected = self._attributes(self.failed_queue_url)["ApproximateNumberOfMessages"]
        found: list[tuple[FailedJob, str]] = []
        empty = 0
        # Until a receive comes back empty, and SQS's (lagging) count is reached
        # or three receives in a row were empty.
        while len(found) < SCAN_LIMIT:
            response = self.client.receive_message(
                QueueUrl=self.failed_queue_url,
                MaxNumberOfMessages=_BATCH,
                VisibilityTimeout=30,
                WaitTimeSeconds=0,
                **{self._attributes_param: _SYSTEM_ATTRIBUTES},
            )
            messages = response.get("Messages", [])
            if not messages:
                empty += 1
                if len(found) >= expected or empty >= 3:
                    break
                continue
            empty = 0
            for message in messages:
                found.append((self._failed_entry(message), message["ReceiptHandle"]))
        return found

    def _failed_entry(self, message: dict[str, Any]) -> FailedJob:
        body = message.get("Body", "")
        sent = int(message.get("Attributes", {}).get("SentTimestamp", "0")) / 1000
        try:
            return self._read_failed_entry(message, body, sent)
        except Exception as exc:  # noqa: BLE001 - whatever is there is listed, never a failed listing
            info = ExceptionInfo.from_exception(
                PayloadError(f"not a rainier_sync message ({type(exc).__name__}: {exc})"[:2000])
            )
            return FailedJob(
                id=message["MessageId"],
                name="(unreadable message)",
                queue="",
                connection=self.connection,
                payload={"raw": body},
                error=info.error,
                exception=info,
                failed_at=sent,
            )

    def _read_failed_entry(self, message: dict[str, Any], body: str, sent: float) -> FailedJob:
        attributes = message.get("Attributes", {})
        data = decode(body)
        if isinstance(data, dict) and data.get(_FAILED_MARK) and isinstance(data.get("job"), dict):
            job = QueuedJob.from_wire(data["job"], connection=self.connection)
            return FailedJob.of(job, ExceptionInfo.from_dict(data.get("error")), float(data.get("failed_at", sent)))
        if isinstance(data, dict) and data.get(_FAILED_MARK) and "raw" in data:
            info = ExceptionInfo.from_dict(data.get("error"))
            return FailedJob(
                id=str(data.get("message_id", message["MessageId"])),
                name="(unreadable message)",
                queue=str(data.get("queue", "")),
                connection=self.connection,
                payload={"raw": data["raw"]},
                error=info.error,
                exception=info,
                failed_at=float(data.get("failed_at", sent)),
            )
        # A job envelope SQS moved here itself (a RedrivePolicy on a job queue);
        # anything else raises, and is listed as unreadable.
        job = self._read(body)
        received = attributes.get("ApproximateReceiveCount", "?")
        info = ExceptionInfo(
            kind="rainier_sync.errors.JobCrashedError",
            message=f"moved to the failed queue by SQS's redrive policy after {received} receive(s)",
            crashed=True,
        )
        return FailedJob.of(job, info, sent)

    def _unhide(self, handles: Sequence[str]) -> None:
        for chunk in _chunks(list(handles)):
            self.client.change_message_visibility_batch(
                QueueUrl=self.failed_queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0} for i, h in enumerate(chunk)],
            )

    def _delete_failed(self, handles: Sequence[str]) -> None:
        for chunk in _chunks(list(handles)):
            self.client.delete_message_batch(
                QueueUrl=self.failed_queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)],
            )

    @_reaching("list failed jobs")
    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        """The newest failed jobs among the first :data:`SCAN_LIMIT` entries of
        the failed queue (each listing receives them all, then lets them go)."""
        found = self._scan_failed()
        self._unhide([handle for _, handle in found])
        entries = sorted((failed for failed, _ in found), key=lambda f: f.failed_at, reverse=True)
        return entries[:limit]

    @_reaching("count failed jobs")
    def failed_count(self) -> int:
        """The failed queue's approximate depth."""
        counts = self._attributes(self.failed_queue_url)
        return counts["ApproximateNumberOfMessages"] + counts["ApproximateNumberOfMessagesNotVisible"]

    @_reaching("retry a failed job")
    def retry_failed(self, id: str) -> bool:
        """Queue a failed job again with fresh attempts (and remove it from the failed queue)."""
        found = self._scan_failed()
        matches = [(failed, handle) for failed, handle in found if failed.id == id]
        others = [handle for failed, handle in found if failed.id != id]
        try:
            if not matches:
                return False
            failed = matches[0][0]
            if failed.job is None:
                others.extend(handle for _, handle in matches)
                raise PayloadError(
                    f"failed message {id} is not a rainier_sync job (unreadable); it can only be forgotten"
                )
            job = replace(failed.job, attempts=0, available_at=_clock.now(), receipt=None)
            url = self.url_of(job.queue)
            self.client.send_message(QueueUrl=url, **self._entry(job, url, _clock.now(), fresh_dedup=True))
            self._delete_failed([handle for _, handle in matches])
            return True
        finally:
            self._unhide(others)

    @_reaching("forget a failed job")
    def forget_failed(self, id: str) -> bool:
        found = self._scan_failed()
        matches = [handle for failed, handle in found if failed.id == id]
        self._unhide([handle for failed, handle in found if failed.id != id])
        if matches:
            self._delete_failed(matches)
        return bool(matches)

    # -- inspection ------------------------------------------------------------------------------
    def _attributes(self, url: str) -> dict[str, int]:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        response = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
        attributes = response.get("Attributes", {})
        return {name: int(attributes.get(name, 0)) for name in names}

    @_reaching("count jobs")
    def counts(self, queue: str) -> QueueCounts:
        """From the queue's approximate attributes: ``reserved`` also holds jobs
        released with a backoff (SQS cannot tell the two apart)."""
        counts = self._attributes(self.url_of(queue))
        return QueueCounts(
            ready=counts["ApproximateNumberOfMessages"],
            delayed=counts["ApproximateNumberOfMessagesDelayed"],
            reserved=counts["ApproximateNumberOfMessagesNotVisible"],
        )

    @_reaching("count jobs")
    def size(self, queue: str | None = None) -> int:
        """Jobs on ``queue`` (every queue when None): ready, delayed and reserved; approximate."""
        names = sorted(self.queue_urls) if queue is None else [queue]
        return sum(self.counts(name).total for name in names)

    def queue_names(self) -> list[str]:
        return sorted(self.queue_urls)

    # -- waiting ------------------------------------------------------------------------------------
    @_reaching("wait for jobs")
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Long-poll each queue (``wait_time``) in the background, returning when
        one answers, ``waker`` is set, or ``timeout`` passes. A poll outlives an
        early return, so an idle worker costs one receive per queue per ``wait_time``."""
        urls = [(queue, self.url_of(queue)) for queue in queues]
        with self._lock:
            error, self._poll_error = self._poll_error, None
            if error is not None:
                raise error
            wanted = {queue for queue, _ in urls}
            if any(item[0] in wanted for item in self._buffer):
                return
            # Only an idle worker long-polls: while its jobs run, one finishing wakes
            # it, and a once worker (which stops when nothing is due) never polls.
            if self.wait_time > 0 and not self._outstanding and not self._closed:
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
        got: list[tuple[str, dict[str, Any], _Receipt]] = []
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
                self._buffer.extend(got)
            waiters = list(self._waiters)
        if closed and got:
            self._let_go(got)
        for waker in waiters:
            waker.set()

    def _let_go(self, items: Sequence[tuple[str, dict[str, Any], _Receipt]]) -> None:
        """Hand back messages received but never handed out, as :meth:`give_back`
        does: the receives before this one were attempts (a run, or a worker that
        died) and stay counted; this one is not."""
        jobs: list[QueuedJob] = []
        unreadable: list[QueuedJob] = []
        for queue, message, receipt in items:
            received = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            try:
                job = self._read(message.get("Body", ""), receipt)
            except PayloadError:
                # The next receive discards it.
                unreadable.append(
                    QueuedJob(id=receipt.message_id, name="(held)", queue=queue, payload={}, receipt=receipt)
                )
                continue
            job.attempts += max(1, received)
            jobs.append(job)
        try:
            self.give_back(jobs)
            if unreadable:
                self._batch(
                    "change_message_visibility_batch",
                    unreadable,
                    lambda receipt: {"ReceiptHandle": receipt.handle, "VisibilityTimeout": 0},
                )
                self._settled(unreadable)
        except Exception as exc:  # noqa: BLE001 - they become visible when their timeout lapses anyway
            self._forget_receipts([receipt for _, _, receipt in items])
            log.warning("could not hand back %d held message(s): %s", len(items), exc)

    def close(self) -> None:
        """Hand back messages a long poll brought in that no worker took, and
        wait (up to ``wait_time``) for the long polls still in flight: SQS hands
        a message arriving meanwhile to such a poll, and were the process gone
        by then it would stay hidden, and its receive would count as an attempt."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held, self._buffer = self._buffer, []
            polls = list(self._poll_threads)
        _OPEN.discard(self)
        if held:
            self._let_go(held)
        deadline = _clock.monotonic() + self.wait_time + 2
        for thread in polls:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - _clock.monotonic()))  # each hands back what it got
        if self._owns_client:
            self.client.close()
            self._poll_client.close()

    def describe(self) -> str:
        return f"sqs {self.queue_urls['default']}"

    def __repr__(self) -> str:
        return (
            f"<SqsQueue default={self.queue_urls['default']!r} queues={sorted(self.queue_urls)} "
            f"region={self.region!r} visibility_timeout={self.reservation:g}>"
        )
