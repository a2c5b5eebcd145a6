"""The records that cross between the manager, the drivers and the worker."""

from __future__ import annotations

import functools
import json
import traceback
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _quote  # C-accelerated, keeps non-ASCII like _ENCODER
from typing import Any, Callable, Literal

from .errors import JobCrashedError, JobTimeoutError, PayloadError

__all__ = [
    "QueuedJob", "FailedJob", "ExceptionInfo", "QueueCounts", "ListedJob", "JobState", "Result", "encode", "decode",
]


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_last_float: tuple[float, str] = (0.0, "0.0")


def float_text(value: float) -> str:
    """``repr(value)``, remembering the last one: the jobs of a batch share their
    times, and the shortest round-trip repr of a float is slow to find."""
    global _last_float
    last = _last_float
    if value and last[0] == value:  # never for zeros: 0.0 == -0.0
        return last[1]
    text = repr(value)
    _last_float = (value, text)
    return text


_last_meta: tuple[dict[str, Any], str] = ({}, "{}")


def _meta_text(meta: dict[str, Any]) -> str:
    """``encode(meta)``, remembering the last one of text values only (equal then
    means the same JSON; ``1 == 1.0`` does not): the jobs of a batch carry equal meta."""
    global _last_meta
    last = _last_meta
    if last[0] == meta:
        return last[1]
    text = encode(meta)
    if all(type(value) is str for value in meta.values()):
        _last_meta = (dict(meta), text)
    return text


#: Job and queue names repeat from job to job: their JSON strings are kept.
_name = functools.lru_cache(maxsize=1024)(_quote)


def encode(data: Any) -> str:
    """Compact JSON, refusing NaN and infinities (not JSON)."""
    return _ENCODER.encode(data)


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode(text: str | bytes) -> Any:
    """Parse JSON text (raises ``ValueError``); every job a worker takes passes here."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    try:
        data, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # not a value where one should start: json says what is wrong
    if end != len(text):
        return json.loads(text)  # trailing whitespace is fine, anything else an error json names
    return data


@dataclass(slots=True)
class QueuedJob:
    """One queued instance of a job, as a driver stores and hands it out.

    ``attempts`` counts the attempts started so far: a job just reserved for
    the first time has ``attempts == 1``. ``available_at`` is seconds since the
    epoch. ``receipt`` is the driver's own handle on a reserved job (a stream
    entry id, an SQS receipt handle, ...) and never goes on the wire.
    """

    id: str
    name: str
    queue: str
    payload: dict[str, Any]
    connection: str = "default"
    attempts: int = 0
    max_attempts: int = 1
    priority: int = 0
    available_at: float = 0.0
    unique_key: str | None = None
    unique_owner: str | None = None
    unique_for: float | None = None
    dispatched_at: float = 0.0
    receipt: Any = field(default=None, compare=False, repr=False)
    #: What the library carries beside the payload (a schedule's tick); None when nothing.
    meta: dict[str, Any] | None = None
    #: The payload's JSON text as the dispatch that built this job checked it;
    #: never copied, so only a freshly built job reuses it.
    payload_json: str | None = field(default=None, init=False, compare=False, repr=False)

    def copy(self, receipt: Any = None) -> QueuedJob:
        """A copy holding ``receipt`` (cheaper than ``dataclasses.replace`` on a hot path)."""
        return QueuedJob(
            self.id,
            self.name,
            self.queue,
            self.payload,
            self.connection,
            self.attempts,
            self.max_attempts,
            self.priority,
            self.available_at,
            self.unique_key,
            self.unique_owner,
            self.unique_for,
            self.dispatched_at,
            receipt,
            self.meta,
        )

    def to_wire(self) -> dict[str, Any]:
        """The JSON-able envelope a driver stores (everything but ``receipt``)."""
        wire: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "queue": self.queue,
            "payload": self.payload,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "available_at": self.available_at,
            "dispatched_at": self.dispatched_at,
        }
        if self.unique_key is not None:
            wire["unique"] = [self.unique_key, self.unique_owner, self.unique_for]
        if self.meta:
            wire["meta"] = self.meta
        return wire

    def encode(self) -> str:
        """The envelope as JSON (``to_wire()``), written directly: this is every dispatch's hot path."""
        available_at, dispatched_at = float(self.available_at), float(self.dispatched_at)
        if available_at - available_at or dispatched_at - dispatched_at:  # NaN or infinite: not JSON
            return encode(self.to_wire())  # raises ValueError naming no field; never reached by a dispatch
        payload = self.payload_json if self.payload_json is not None else encode(self.payload)
        text = (
            f'{{"id":{_quote(self.id)},"name":{_name(self.name)},"queue":{_name(self.queue)},"payload":{payload},'
            f'"attempts":{int(self.attempts)},"max_attempts":{int(self.max_attempts)},"priority":{int(self.priority)},'
            f'"available_at":{float_text(available_at)},"dispatched_at":{float_text(dispatched_at)}'
        )
        if self.unique_key is not None:
            text += ',"unique":' + encode([self.unique_key, self.unique_owner, self.unique_for])
        if self.meta:
            text += ',"meta":' + _meta_text(self.meta)
        return text + "}"

    @classmethod
    def from_wire(cls, data: Any, *, connection: str = "default", receipt: Any = None) -> QueuedJob:
        """Rebuild from an envelope; raises :class:`PayloadError` naming what is wrong."""
        if not isinstance(data, dict):
            raise PayloadError(f"a queued job must be a JSON object, got {type(data).__name__}")
        try:
            name = data["name"]
            job_id = data["id"]
            payload = data["payload"]
        except KeyError as missing:
            raise PayloadError(f"a queued job has no {missing.args[0]!r} field") from None
        if not isinstance(name, str) or not isinstance(job_id, str):
            raise PayloadError("a queued job's 'id' and 'name' must be strings")
        if not isinstance(payload, dict):
            raise PayloadError(f"job {name!r}: payload must be a JSON object")
        unique = data.get("unique")
        meta = data.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise PayloadError(f"job {name!r} ({job_id}): meta must be a JSON object")
        try:
            queue = data.get("queue", "default")
            job = cls(
                job_id,
                name,
                queue if type(queue) is str else str(queue),
                payload,
                connection,
                _count(data, "attempts", 0, 0),
                _count(data, "max_attempts", 1, 1),
                _count(data, "priority", 0, -MAX_COUNT),
                _time(data, "available_at"),
                unique[0] if unique else None,
                unique[1] if unique else None,
                unique[2] if unique else None,
                _time(data, "dispatched_at"),
                receipt,
                meta or None,
            )
        except (TypeError, ValueError, IndexError) as exc:
            raise PayloadError(f"job {name!r} ({job_id}): malformed envelope: {exc}") from None
        return job

    @classmethod
    def decode(cls, text: str | bytes, *, connection: str = "default", receipt: Any = None) -> QueuedJob:
        """Rebuild from envelope JSON; raises :class:`PayloadError` saying what is wrong."""
        try:
            data = decode(text)
        except ValueError as exc:
            raise PayloadError(f"a queued job is not valid JSON: {exc}") from None
        except RecursionError:
            raise PayloadError("a queued job is nested too deeply to read") from None
        return cls.from_wire(data, connection=connection, receipt=receipt)


#: The largest attempt count or priority an envelope may carry.
MAX_COUNT = 1_000_000


def _count(data: dict[str, Any], key: str, default: int, least: int) -> int:
    """A whole number field of an envelope, between ``least`` and :data:`MAX_COUNT`."""
    value = data.get(key, default)
    if type(value) is not int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{key} must be a whole number, got {value!r}")
    if not least <= value <= MAX_COUNT:
        raise ValueError(f"{key} {value} is outside {least}..{MAX_COUNT}")
    return value


def _time(data: dict[str, Any], key: str) -> float:
    """A time field of an envelope: seconds since the epoch, finite."""
    value = data.get(key, 0.0)
    if type(value) is bool or not isinstance(value, (int, float)) or value - value:
        raise ValueError(f"{key} must be a finite number of seconds, got {value!r}")
    return float(value)


@dataclass(slots=True, frozen=True)
class ExceptionInfo:
    """A failure as data: what the events carry and the failed store keeps.

    ``causes`` is the chain below the exception (``__cause__`` or
    ``__context__``), outermost first, each as ``(kind, message)``.
    ``timed_out`` is set when the attempt overran its time limit, ``crashed``
    when the process running it died.
    """

    kind: str
    message: str
    causes: tuple[tuple[str, str], ...] = ()
    traceback: str = ""
    timed_out: bool = False
    crashed: bool = False

    @property
    def error(self) -> str:
        """The one-line string the failed store keeps and the log prints."""
        return f"{self.kind}: {self.message}" if self.message else self.kind

    @classmethod
    def from_exception(cls, exc: BaseException) -> ExceptionInfo:
        causes: list[tuple[str, str]] = []
        seen = {id(exc)}
        below = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        while below is not None and id(below) not in seen and len(causes) < 20:
            seen.add(id(below))
            causes.append((_kind(below), str(below)))
            below = below.__cause__ or (None if below.__suppress_context__ else below.__context__)
        return cls(
            kind=_kind(exc),
            message=str(exc),
            causes=tuple(causes),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            timed_out=isinstance(exc, JobTimeoutError),
            crashed=isinstance(exc, JobCrashedError),
        )

    @classmethod
    def from_message(cls, message: str) -> ExceptionInfo:
        kind, sep, rest = message.partition(": ")
        if sep and kind and " " not in kind:
            return cls(kind=kind, message=rest)
        return cls(kind="Error", message=message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "causes": [list(c) for c in self.causes],
            "traceback": self.traceback,
            "timed_out": self.timed_out,
            "crashed": self.crashed,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ExceptionInfo:
        if not isinstance(data, dict):
            return cls.from_message(str(data))
        return cls(
            kind=str(data.get("kind", "Error")),
            message=str(data.get("message", "")),
            causes=tuple((str(k), str(m)) for k, m in data.get("causes", ())),
            traceback=str(data.get("traceback", "")),
            timed_out=bool(data.get("timed_out", False)),
            crashed=bool(data.get("crashed", False)),
        )


def _kind(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def as_exception_info(error: BaseException | str | ExceptionInfo) -> ExceptionInfo:
    """What ``fail(job, error)`` accepts, as an :class:`ExceptionInfo`."""
    if isinstance(error, ExceptionInfo):
        return error
    if isinstance(error, BaseException):
        return ExceptionInfo.from_exception(error)
    return ExceptionInfo.from_message(str(error))


@dataclass(slots=True)
class FailedJob:
    """A job that used up its attempts (or could not be run at all)."""

    id: str
    name: str
    queue: str
    connection: str
    payload: dict[str, Any]
    error: str
    exception: ExceptionInfo
    failed_at: float
    attempts: int = 0
    max_attempts: int = 1
    job: QueuedJob | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, job: QueuedJob, info: ExceptionInfo, failed_at: float) -> FailedJob:
        return cls(
            id=job.id,
            name=job.name,
            queue=job.queue,
            connection=job.connection,
            payload=job.payload,
            error=info.error,
            exception=info,
            failed_at=failed_at,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            job=job,
        )


@dataclass(slots=True, frozen=True)
class QueueCounts:
    """How many jobs of one queue are in each state."""

    ready: int = 0
    delayed: int = 0
    reserved: int = 0

    @property
    def total(self) -> int:
        return self.ready + self.delayed + self.reserved


#: The states a stored job can be listed in.
JobState = Literal["ready", "delayed", "reserved"]
JOB_STATES: tuple[JobState, ...] = ("ready", "delayed", "reserved")


@dataclass(frozen=True)
class ListedJob:
    """One stored job as :meth:`~rainier_sync.drivers.base.Inspector.list_jobs` reads it:
    the job, its state, and until when it is reserved (``None`` unless reserved)."""

    job: QueuedJob
    state: JobState
    reserved_until: float | None = None


@dataclass(frozen=True)
class Result:
    """What :meth:`~rainier_sync.QueueManager.result` reports of a job.

    ``status`` is ``"pending"`` (queued or running), ``"processed"`` (``value``
    is what ``handle`` returned), ``"failed"`` (``error`` says why) or
    ``"unknown"`` (no such job keeps a result, or its result expired).
    """

    status: str
    value: Any = None
    error: str | None = None
