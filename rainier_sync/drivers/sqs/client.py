"""Calls to SQS: the boto3 clients, their timeouts and retries, and what an
unreachable server or a refused batch entry becomes."""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast
from urllib.parse import urlsplit

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from ...errors import ConfigurationError, SqsBatchError, SqsUnavailableError, UnknownQueueError
from ...types import QueuedJob
from ..base import BaseQueue
from ..pushed import pushed_before, tell_pushed

boto3: Any
_BotoConfig: Any
#: botocore's errors for a server it could not reach: refused, timed out, cut off.
_UNREACHABLE: tuple[type[Exception], ...] = ()
#: botocore's error for an answer that is an error (its code says which).
_ANSWERED: tuple[type[Exception], ...] = ()
try:
    boto3 = importlib.import_module("boto3")
    _BotoConfig = importlib.import_module("botocore.config").Config
    _botocore_errors = importlib.import_module("botocore.exceptions")
    _UNREACHABLE = (_botocore_errors.ConnectionError, _botocore_errors.HTTPClientError)
    _ANSWERED = (_botocore_errors.ClientError,)
except ImportError:  # pragma: no cover - exercised only without the extra
    boto3 = None
    _BotoConfig = None

log = logging.getLogger("rainier_sync")

#: Entries in one SQS batch call, at most.
BATCH = 10
#: Tries of one call (the first and two retries) before it raises.
TRIES = 3
#: ReceiveMessage's system attributes the driver reads.
SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp"]
#: Error codes of an SQS that cannot serve a call for now (a throttle), as opposed to one refusing it.
_PASSING_CODES = {
    "Throttling", "ThrottlingException", "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
    "ServiceUnavailable", "InternalError", "InternalFailure", "KMS.ThrottlingException",
}  # fmt: skip
_STALE_CODES = {"ReceiptHandleIsInvalid", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight"}
_COUNTS = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]


@dataclass(slots=True, frozen=True)
class Receipt:
    """Where a received message came from and the handle to settle it with."""

    queue: str
    url: str
    handle: str
    message_id: str
    received_at: float


class _RetryableEntries(Exception):
    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__(failed)
        self.failed = failed


def check_url(name: str, url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or not urlsplit(url).path.strip("/"):
        raise ConfigurationError(
            f"SqsQueue {name} must be a queue's whole URL "
            f"(https://sqs.<region>.amazonaws.com/<account>/<queue name>), got {url!r}"
        )
    return url


def region_of(url: str) -> str | None:
    """The region an AWS queue URL names, or None."""
    host = urlsplit(url).hostname or ""
    if not host.endswith(".amazonaws.com"):
        return None
    parts = host.split(".")
    if parts[0] == "sqs" and len(parts) > 3:
        return parts[1]
    if len(parts) > 3 and parts[1] == "queue":
        return parts[0]
    return None


def is_fifo(url: str) -> bool:
    return url.rstrip("/").endswith(".fifo")


def chunks(items: Sequence[Any], size: int = BATCH) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def passing_refusal(exc: BaseException) -> bool:
    """An answer that SQS cannot serve the call now (a 5xx, a throttle), through
    every try boto3 made: an outage, not a refusal of what was sent."""
    if not isinstance(exc, _ANSWERED):
        return False
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = str(response.get("Error", {}).get("Code", ""))
    return (isinstance(status, int) and status >= 500) or code in _PASSING_CODES


def attributes_param(client: Any) -> str:
    """Newer botocore names ReceiveMessage's system attributes
    ``MessageSystemAttributeNames``; older releases only know ``AttributeNames``."""
    try:
        members = client.meta.service_model.operation_model("ReceiveMessage").input_shape.members
    except Exception:  # noqa: BLE001 - a client without a service model: assume the current name
        return "MessageSystemAttributeNames"
    return "MessageSystemAttributeNames" if "MessageSystemAttributeNames" in members else "AttributeNames"


def stale_receipt(exc: Exception) -> bool:
    """SQS's answer when a receipt no longer holds its message: the message is
    gone, or its reservation lapsed and another receive took it."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    code, message = str(error.get("Code", "")), str(error.get("Message", "")).lower()
    return code in _STALE_CODES or (code == "InvalidParameterValue" and "receipthandle" in message.replace(" ", ""))


def build_clients(
    *,
    key: str | None,
    secret: str | None,
    region: str | None,
    endpoint: str | None,
    timeout: float,
    wait_time: int,
    queues: int,
) -> tuple[Any, Any, str]:
    """A client for every call, one for long polls, whose answer takes up to
    ``wait_time`` longer (a frozen endpoint must not hold a dispatch that
    long), and the region they use."""
    assert boto3 is not None and _BotoConfig is not None
    session = boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret, region_name=region)
    if session.region_name is None:
        raise ConfigurationError(
            "SqsQueue needs a region: pass region=... (or set AWS_DEFAULT_REGION); it could not be read from queue_url"
        )
    retries = {"total_max_attempts": TRIES, "mode": "standard"}
    calls = _BotoConfig(retries=retries, connect_timeout=timeout, read_timeout=timeout, max_pool_connections=20)
    polls = _BotoConfig(
        retries=retries,
        connect_timeout=timeout,
        read_timeout=wait_time + timeout,
        max_pool_connections=max(10, queues),
    )
    return (
        session.client("sqs", endpoint_url=endpoint, config=calls),
        session.client("sqs", endpoint_url=endpoint, config=polls),
        session.region_name,
    )


class SqsLink:
    """What every part of one :class:`SqsQueue` calls SQS through: its clients,
    its queues' URLs, and the driver they speak for (its connection name, and
    the sender of its signals)."""

    def __init__(
        self,
        owner: BaseQueue,
        *,
        client: Any,
        poll_client: Any,
        queue_urls: Mapping[str, str],
        failed_queue_url: str,
        endpoint: str | None,
        timeout: float,
    ) -> None:
        self.owner = owner
        self.client = client
        self.poll_client = poll_client
        self.queue_urls = dict(queue_urls)
        self.failed_queue_url = failed_queue_url
        self.endpoint = endpoint
        self.timeout = timeout
        self.attributes_param = attributes_param(client)

    @property
    def connection(self) -> str:
        return self.owner.connection

    def unreachable(self, action: str, exc: Exception) -> SqsUnavailableError:
        where = self.endpoint or getattr(getattr(self.client, "meta", None), "endpoint_url", None) or "SQS"
        error = SqsUnavailableError(
            f"SQS connection {self.connection!r} could not reach {where} to {action} "
            f"({TRIES} tries, {self.timeout:g} s each to connect and to answer): {exc}"
        )
        for note in getattr(exc, "__notes__", ()):
            error.add_note(note)
        return error

    def not_serving(self, action: str, exc: Exception) -> SqsUnavailableError:
        """An SQS that answered, through every try, that it cannot serve the call now."""
        error = SqsUnavailableError(f"SQS connection {self.connection!r} could not {action} ({TRIES} tries): {exc}")
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

    def attributes(self, url: str) -> dict[str, int]:
        """A queue's approximate message counts."""
        response = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=_COUNTS)
        attributes = response.get("Attributes", {})
        return {name: int(attributes.get(name, 0)) for name in _COUNTS}

    def send_batch(
        self, url: str, batch: Sequence[tuple[QueuedJob, dict[str, Any]]]
    ) -> tuple[list[QueuedJob], dict[str, str], set[str]]:
        """One ``SendMessageBatch`` (ten at most), its passing failures retried:
        the jobs sent, SQS's reason by job id for those that were not, and which
        of those SQS called the sender's fault (sending them again fails again)."""
        pending = {str(i): item for i, item in enumerate(batch)}
        done: list[QueuedJob] = []
        final: dict[str, str] = {}
        sender_fault: set[str] = set()

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
                    sender_fault.add(job.id)
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
        return done, final, sender_fault

    def receipt_batch(self, method: str, jobs: Sequence[QueuedJob], entry: Any) -> list[QueuedJob]:
        """Run a receipt batch call per queue URL; an entry SQS refuses as the
        sender's fault (a stale receipt) is logged, anything else raises."""
        by_url: dict[str, list[QueuedJob]] = {}
        for job in jobs:
            if isinstance(job.receipt, Receipt):
                by_url.setdefault(job.receipt.url, []).append(job)
        call = getattr(self.client, method)
        problems: dict[str, str] = {}
        done: list[str] = []
        through: list[QueuedJob] = []
        for url, group in by_url.items():
            for chunk in chunks(group):
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


_Method = TypeVar("_Method", bound=Callable[..., Any])


def reaching(action: str, *, serving: bool = False) -> Callable[[_Method], _Method]:
    """Raise :class:`SqsUnavailableError` for a server the call could not reach
    (on a method of an object whose ``link`` is an :class:`SqsLink`); with
    ``serving``, also for one that kept answering it cannot serve the call now
    (:func:`passing_refusal`). What the call had done goes along (:mod:`..pushed`)."""

    def decorate(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except _UNREACHABLE as exc:
                link: SqsLink = self.link
                raise _along(link.unreachable(action, exc), exc) from exc
            except _ANSWERED as exc:
                if not (serving and passing_refusal(exc)):
                    raise
                raise _along(self.link.not_serving(action, exc), exc) from exc

        return cast(_Method, call)

    return decorate


def _along(error: SqsUnavailableError, cause: Exception) -> SqsUnavailableError:
    """``error`` carrying what the push that raised ``cause`` had done."""
    done = pushed_before(cause)
    if done.stored or done.refused:
        tell_pushed(error, done.stored, done.refused)
    return error
