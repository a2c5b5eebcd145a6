"""What goes on an SQS queue: jobs as message bodies and send entries within
SQS's limits, failed-queue entries, and reading them back."""

from __future__ import annotations

import hashlib
import math
import uuid
from typing import Any

from ...errors import PayloadError
from ...types import ExceptionInfo, FailedJob, QueuedJob, decode, encode
from .client import BATCH, Receipt, is_fifo

#: SQS's longest per-message delay; longer delays hop (re-send with what is left).
MAX_DELAY = 900
#: SQS's largest message, and largest batch (the sum of its entries).
MAX_MESSAGE_BYTES = 1_048_576
_FAILED_MARK = "rainier_failed"

_Item = tuple[QueuedJob, dict[str, Any]]


def one_delay(wait: float) -> bool:
    """Whether a message's own delay can hold ``wait`` seconds (else it hops)."""
    return wait <= MAX_DELAY


def hop_delay(remaining: float) -> int:
    """The delay of the next hop of a job due in ``remaining`` seconds."""
    return min(MAX_DELAY, max(1, math.ceil(remaining)))


def body(job: QueuedJob) -> str:
    """``job`` as a message body; :class:`PayloadError` past SQS's size limit."""
    text = job.encode()
    if len(text.encode()) > MAX_MESSAGE_BYTES:
        raise PayloadError(
            f"job {job.name!r} ({job.id}) is {len(text.encode())} bytes as JSON; SQS takes at most "
            f"{MAX_MESSAGE_BYTES}: pass a reference (a key, an id) instead of the data"
        )
    return text


def entry(job: QueuedJob, url: str, now: float, *, fresh_dedup: bool = False) -> dict[str, Any]:
    """One SendMessage(Batch) entry for ``job``, its delay capped at SQS's 15 minutes;
    :class:`PayloadError` for a job SQS can never take."""
    result: dict[str, Any] = {"MessageBody": body(job)}
    wait = job.available_at - now
    if is_fifo(url):
        if wait > 0:
            raise PayloadError(
                f"job {job.name!r} ({job.id}) has a delay, but queue {job.queue!r} is a FIFO queue, "
                "and SQS FIFO queues take no per-message delay"
            )
        result["MessageGroupId"] = job.name
        if job.unique_key is not None and not fresh_dedup:
            result["MessageDeduplicationId"] = hashlib.sha256(job.unique_key.encode()).hexdigest()
        else:
            result["MessageDeduplicationId"] = job.id if not fresh_dedup else uuid.uuid4().hex
    elif wait > 0:
        result["DelaySeconds"] = min(MAX_DELAY, math.ceil(wait))
    return result


def size_batches(items: list[_Item]) -> list[list[_Item]]:
    """Send entries in batches of ten at most, each within SQS's batch size."""
    batches: list[list[_Item]] = []
    current: list[_Item] = []
    size = 0
    for item in items:
        length = len(item[1]["MessageBody"].encode())
        if current and (len(current) == BATCH or size + length > MAX_MESSAGE_BYTES):
            batches.append(current)
            current, size = [], 0
        current.append(item)
        size += length
    if current:
        batches.append(current)
    return batches


def read(text: str, connection: str, receipt: Receipt | None = None) -> QueuedJob:
    """The job a message's body carries; :class:`PayloadError` saying why for
    anything that is not one (any exception while decoding it: not JSON,
    nested too deep to parse, missing fields, an attempt count that is
    negative or absurd, a time that is not a number)."""
    try:
        job = QueuedJob.decode(text, connection=connection, receipt=receipt)
    except PayloadError:
        raise
    except Exception as exc:  # whatever else decoding one message raises costs only that message
        raise PayloadError(f"a queued job could not be read: {type(exc).__name__}: {exc}") from exc
    return job


def _entry(data: dict[str, Any]) -> str:
    """A failed-queue entry as JSON, a lone surrogate (in an error message, say)
    as its escape: SQS takes only UTF-8, and the escape reads back the same."""
    text = encode(data)
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def failed_job_body(job: QueuedJob, info: ExceptionInfo, failed_at: float) -> str:
    """The failed queue's entry for a job that failed."""
    return _entry({_FAILED_MARK: 1, "job": job.to_wire(), "error": info.to_dict(), "failed_at": failed_at})


def unreadable_body(raw: str, queue: str, message_id: str, info: ExceptionInfo, failed_at: float) -> str:
    """The failed queue's entry for a message that carried no readable job."""
    return _entry(
        {
            _FAILED_MARK: 1,
            "raw": raw,
            "queue": queue,
            "message_id": message_id,
            "error": info.to_dict(),
            "failed_at": failed_at,
        }
    )


def fit(text: str) -> str:
    """A failed-queue entry within SQS's size limit: its traceback trimmed, and
    then the raw message it keeps."""
    if len(text.encode()) <= MAX_MESSAGE_BYTES:
        return text
    # The traceback is what makes an entry too big; keep the job, trim the story.
    data = decode(text)
    data["error"]["traceback"] = data["error"].get("traceback", "")[-4000:]
    text = _entry(data)
    if len(text.encode()) > MAX_MESSAGE_BYTES and isinstance(data.get("raw"), str):
        # An unreadable message near SQS's size limit, escaped: keep its beginning.
        raw: str = data["raw"]
        data["raw_length"] = len(raw)
        keep = len(raw)
        while keep and len(text.encode()) > MAX_MESSAGE_BYTES:
            keep = keep * 9 // 10
            data["raw"] = raw[:keep]
            text = _entry(data)
    return text


def failed_entry(message: dict[str, Any], connection: str) -> FailedJob:
    """The failed job a failed-queue message tells of; one that tells of none
    is listed as an unreadable message."""
    text = message.get("Body", "")
    sent = int(message.get("Attributes", {}).get("SentTimestamp", "0")) / 1000
    try:
        return _read_failed_entry(message, text, sent, connection)
    except Exception as exc:  # noqa: BLE001 - whatever is there is listed, never a failed listing
        info = ExceptionInfo.from_exception(
            PayloadError(f"not a rainier_sync message ({type(exc).__name__}: {exc})"[:2000])
        )
        return FailedJob(
            id=message["MessageId"],
            name="(unreadable message)",
            queue="",
            connection=connection,
            payload={"raw": text},
            error=info.error,
            exception=info,
            failed_at=sent,
        )


def _read_failed_entry(message: dict[str, Any], text: str, sent: float, connection: str) -> FailedJob:
    attributes = message.get("Attributes", {})
    data = decode(text)
    if isinstance(data, dict) and data.get(_FAILED_MARK) and isinstance(data.get("job"), dict):
        job = QueuedJob.from_wire(data["job"], connection=connection)
        return FailedJob.of(job, ExceptionInfo.from_dict(data.get("error")), float(data.get("failed_at", sent)))
    if isinstance(data, dict) and data.get(_FAILED_MARK) and "raw" in data:
        info = ExceptionInfo.from_dict(data.get("error"))
        return FailedJob(
            id=str(data.get("message_id", message["MessageId"])),
            name="(unreadable message)",
            queue=str(data.get("queue", "")),
            connection=connection,
            payload={"raw": data["raw"]},
            error=info.error,
            exception=info,
            failed_at=float(data.get("failed_at", sent)),
        )
    # A job envelope SQS moved here itself (a RedrivePolicy on a job queue);
    # anything else raises, and is listed as unreadable.
    job = read(text, connection)
    received = attributes.get("ApproximateReceiveCount", "?")
    info = ExceptionInfo(
        kind="rainier_sync.errors.JobCrashedError",
        message=f"moved to the failed queue by SQS's redrive policy after {received} receive(s)",
        crashed=True,
    )
    return FailedJob.of(job, info, sent)
