"""How the Redis driver writes jobs and records, and reads stream entries back.

Pure functions and values: no connection, no state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from ...errors import PayloadError
from ...types import ExceptionInfo, QueuedJob, encode

#: Jobs per EVALSHA when pushing or acknowledging in bulk (Lua's unpack limit is ~8000).
_CHUNK = 1000
#: Delayed jobs promoted per queue per reserve.
_PROMOTE = 1000
_GROUP = "rainier"


class _Receipt(NamedTuple):
    """Where a reserved job's stream entry is, and its envelope to put back on release."""

    queue: str
    band: bytes
    entry: bytes
    body: bytes


#: An entry an idle loop's blocking read took: queue, band, entry id, its fields,
#: and when (monotonic) the read was sent.
_Taken = tuple[str, bytes, bytes, list[bytes], float]


def _num(value: float) -> str:
    return repr(float(value))


def _record(record: dict[str, Any]) -> str:
    """A failed-store record as JSON; ASCII, so that a lone surrogate a stored job
    brought in (``"\\ud800"`` is valid JSON) cannot stop it being written."""
    return json.dumps(record, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def _utf8(job: QueuedJob, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise PayloadError(f"job {job.id!r} ({job.name!r}) cannot be stored: not valid UTF-8 text: {exc}") from None


def _line(job: QueuedJob) -> str:
    """queue TAB priority TAB attempts TAB due TAB json; PayloadError naming the job if it cannot be stored."""
    queue = job.queue
    if not isinstance(queue, str) or not queue or "\t" in queue or "\n" in queue:
        raise PayloadError(
            f"job {job.id} ({job.name}): queue must be a non-empty string without tabs or newlines, got {queue!r}"
        )
    priority = job.priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PayloadError(f"job {job.id} ({job.name}): priority must be an int, got {priority!r}")
    try:
        float(priority)  # a band's score in Redis: a double
        body = job.encode()
    except Exception as exc:  # noqa: BLE001 - NaN, a payload JSON cannot hold, nesting too deep...
        raise PayloadError(f"job {job.id} ({job.name}) cannot be stored: {type(exc).__name__}: {exc}") from None
    return f"{queue}\t{priority}\t{job.attempts}\t{float(job.available_at)!r}\t{body}"


def _push_args(job: QueuedJob) -> list[Any]:
    """A job as the separate arguments of ``push()`` in Lua (for the scripts that push one job)."""
    return _utf8(job, _line(job)).split(b"\t", 4)


def _blob(jobs: Sequence[QueuedJob]) -> bytes:
    """The ``push`` script's jobs argument: one line per job."""
    text = "\n".join([_line(job) for job in jobs])
    try:
        return text.encode()
    except UnicodeEncodeError:
        for job in jobs:  # which one: a lone surrogate somewhere in it
            _utf8(job, _line(job))
        raise  # pragma: no cover - one of them could not be encoded


def _receipt(job: QueuedJob) -> _Receipt | None:
    receipt = job.receipt
    return receipt if isinstance(receipt, _Receipt) else None


def _envelope(fields: list[bytes]) -> tuple[bytes, bytes]:
    """A stream entry's envelope and attempts count; PayloadError when it holds no job."""
    if len(fields) == 4 and fields[0] == b"j" and fields[2] == b"a":
        body, attempts = fields[1], fields[3]
    else:
        named = dict(zip(fields[::2], fields[1::2], strict=False))
        if b"j" not in named:
            raise PayloadError("the stream entry has no 'j' (job) field")
        body, attempts = named[b"j"], named.get(b"a", b"0")
    if not attempts.isdigit() or len(attempts) > 9:
        raise PayloadError(f"the stream entry's attempts field is not a count: {attempts[:40]!r}")
    return body, attempts


def _entry_job(queue: str, band: bytes, entry: bytes, fields: list[bytes], connection: str) -> QueuedJob:
    """The job a reserved stream entry holds, its attempt counted; raises when it is unreadable."""
    body, attempts = _envelope(fields)
    job = QueuedJob.decode(body, connection=connection, receipt=_Receipt(queue, band, entry, body))
    job.attempts = int(attempts) + 1
    return job


def _raw_fields(fields: list[bytes]) -> str:
    """An unreadable entry's fields as JSON text, kept in its failed-store record."""
    named = zip(fields[::2], fields[1::2], strict=False)
    return encode({k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in named})


def _unreadable(queue: str, band: bytes, entry: bytes) -> tuple[str, dict[str, Any]]:
    """The failed-store id and stand-in job of an unreadable entry."""
    failed_id = f"unreadable-{queue}-{entry.decode()}"
    return failed_id, {"id": failed_id, "name": "<unreadable>", "queue": queue, "payload": {}, "priority": int(band)}


def _failed_record(job: dict[str, Any], info: ExceptionInfo, failed_at: float, raw: str | None = None) -> str:
    """A failed-store record: the job's wire form, its error, when, and an unreadable entry's raw fields."""
    record: dict[str, Any] = {"job": job}
    if raw is not None:
        record["raw"] = raw
    record.update(error=info.error, exception=info.to_dict(), failed_at=failed_at)
    return _record(record)
