"""The job contract and the context a running job sees."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Callable, ClassVar, TypeVar, overload

from . import backoff as _backoff
from .errors import JobDefinitionError, PayloadError
from .types import MAX_COUNT, encode

if TYPE_CHECKING:
    from .container import Container

__all__ = ["Job", "JobContext"]

T = TypeVar("T")
J = TypeVar("J", bound="Job")

_DEFAULT_BACKOFF = _backoff.exponential(base=1, cap=64)
#: The deepest nesting of lists and objects a payload may have: every worker
#: must be able to read it back, and JSON parsers recurse.
MAX_DEPTH = 200
_CONTAINERS = frozenset({dict, list, tuple})
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def check_queue_name(queue: Any) -> str:
    """``queue`` if it can name a queue on every driver; else a ValueError naming it."""
    if not isinstance(queue, str) or not queue:
        raise ValueError(f"queue must be a non-empty string, got {queue!r}")
    if "\x00" in queue:
        raise ValueError(f"queue name {queue!r} contains a NUL character, which no backend can store")
    return queue


def check_count(name: str, value: Any, least: int) -> int:
    """``value`` if it is an int a worker can read back (``least`` to ``MAX_COUNT``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not least <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be between {least} and {MAX_COUNT}, got {value!r}")
    return value


def check_job_class(job_class: type[Job]) -> None:
    """Refuse a job class whose ``NAME``, ``QUEUE``, ``TRIES``, ``PRIORITY`` or
    ``KEEP_RESULT`` no worker could read back, with :class:`JobDefinitionError` naming the class."""
    try:
        if "\x00" in job_class.NAME:
            raise ValueError(f"NAME {job_class.NAME!r} contains a NUL character, which no backend can store")
        check_queue_name(job_class.QUEUE)
        check_count("TRIES", job_class.TRIES, 1)
        check_count("PRIORITY", job_class.PRIORITY, -MAX_COUNT)
        keep = job_class.KEEP_RESULT
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep < 1e9):
            raise ValueError(f"KEEP_RESULT must be a positive number of seconds or None, got {keep!r}")
    except (TypeError, ValueError) as exc:
        raise JobDefinitionError(f"{job_class.__qualname__}: {exc}") from None


def _wire_problem(value: Any, text: str) -> str | None:
    """What keeps ``value`` (encoded as ``text``) from arriving as it was sent: a
    string UTF-8 cannot carry, a key that is not a string, nesting too deep to
    read back. None when it travels intact."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"holds {exc.object[exc.start:exc.end]!r}, a lone surrogate that UTF-8 cannot encode"
    objects = text.count("{")  # brackets inside strings only make these counts err on the side of a walk
    if objects == (type(value) is dict) and objects + text.count("[") <= MAX_DEPTH:
        # Shallow, with no object below the top one: only its own keys are left to check.
        if objects and not all(type(key) is str for key in value):
            return _walk(value, 0)
        return None
    return _walk(value, 0)


def _walk(value: Any, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"is nested more than {MAX_DEPTH} levels deep"
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"has the key {key!r}, which is not a string (JSON keys are strings: it would arrive as " \
                    f"{encode(key)!r})"
            if type(item) in _CONTAINERS and (problem := _walk(item, depth + 1)) is not None:
                return problem
    elif kind is list or kind is tuple:
        for item in value:
            if type(item) in _CONTAINERS and (problem := _walk(item, depth + 1)) is not None:
                return problem
    return None


class Job:
    """Base class of a job: a JSON payload plus a stable ``NAME``.

    Subclass it as a ``@dataclass``; the fields are the payload. Class
    attributes configure it:

    - ``NAME``: the name on the wire. Required, unique, never renamed while
      jobs of this type may be queued.
    - ``QUEUE``: the queue it goes to (``"default"``).
    - ``TRIES``: total attempts (1).
    - ``TIMEOUT``: seconds an attempt may run, or ``None`` for the worker's default.
    - ``PRIORITY``: lower runs first within a queue (0).
    - ``UNIQUE_FOR``: seconds a unique lock may outlive a dead worker (3600).
    - ``BACKOFF``: a strategy from :mod:`rainier_sync.backoff` or tenacity,
      used by the default :meth:`backoff`.
    - ``KEEP_RESULT``: seconds to keep ``handle``'s return value (JSON) for
      :meth:`~rainier_sync.QueueManager.result`; None (the default) keeps none.
    """

    NAME: ClassVar[str]
    QUEUE: ClassVar[str] = "default"
    TRIES: ClassVar[int] = 1
    TIMEOUT: ClassVar[float | None] = None
    PRIORITY: ClassVar[int] = 0
    UNIQUE_FOR: ClassVar[float] = 3600
    BACKOFF: ClassVar[Any] = None
    MEMORY_LIMIT: ClassVar[int | None] = None
    KEEP_RESULT: ClassVar[float | None] = None

    def handle(self, context: JobContext) -> Any:
        """Do the work. Raising fails the attempt; what it returns is kept only
        with ``KEEP_RESULT`` (and must then be JSON)."""
        raise NotImplementedError(f"{type(self).__qualname__} does not define handle()")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retrying after attempt number ``attempt`` failed."""
        strategy = type(self).BACKOFF
        if strategy is None:
            return _DEFAULT_BACKOFF(attempt)
        return _backoff.resolve(strategy)(attempt)

    def failed(self, context: JobContext, error: BaseException) -> None:
        """Called once, after the final attempt failed."""

    def unique_id(self) -> str | None:
        """What makes two of these "the same job"; ``None`` means not unique."""
        return None

    def middleware(self) -> list[Any]:
        """What wraps each attempt, outermost first: objects with
        ``handle(job, context, call_next)`` (see :mod:`rainier_sync.middleware`)."""
        return []

    def to_payload(self) -> dict[str, Any]:
        """The payload as a JSON-able dict (the dataclass fields by default)."""
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            if not dataclasses.is_dataclass(self):
                raise PayloadError(
                    f"{type(self).__qualname__} is not a dataclass: decorate it with @dataclass "
                    "or override to_payload() and from_payload()"
                )
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in dataclasses.fields(self) if f.init)
        return {name: getattr(self, name) for name in names}

    @classmethod
    def from_payload(cls: type[J], payload: dict[str, Any]) -> J:
        """Rebuild a job from its payload."""
        try:
            return cls(**payload)
        except TypeError as exc:
            raise PayloadError(f"job {getattr(cls, 'NAME', cls.__qualname__)!r}: payload does not fit: {exc}") from None

    def encoded_payload(self) -> tuple[dict[str, Any], str]:
        """The payload and its JSON text; :class:`PayloadError` naming the field
        that cannot cross the wire as it is."""
        payload = self.to_payload()
        if not isinstance(payload, dict):
            raise PayloadError(f"{type(self).__qualname__}.to_payload() must return a dict")
        try:
            text = encode(payload)
        except (TypeError, ValueError, RecursionError):
            raise self._payload_error(payload) from None
        # Most payloads are flat dataclass fields, in plain ASCII: nothing more to look at.
        if (
            not text.isascii()
            or not _CONTAINERS.isdisjoint(map(type, payload.values()))
            or type(self).to_payload is not _DATACLASS_PAYLOAD
        ):
            if _wire_problem(payload, text) is not None:
                raise self._payload_error(payload)
        return payload, text

    def _payload_error(self, payload: dict[str, Any]) -> PayloadError:
        """The error naming the first field of ``payload`` that cannot go on the wire."""
        name = getattr(type(self), "NAME", type(self).__qualname__)
        for key, value in payload.items():
            if type(key) is not str:
                return PayloadError(
                    f"job {name!r}: payload key {key!r} is not a string (JSON keys are strings: "
                    f"it would arrive as {encode(key)!r})"
                )
            try:
                text = encode(value)
            except RecursionError:
                return PayloadError(f"job {name!r}: field {key!r} is nested more than {MAX_DEPTH} levels deep")
            except (TypeError, ValueError) as exc:
                return PayloadError(
                    f"job {name!r}: field {key!r} is not JSON-serialisable ({type(value).__name__}): {exc}"
                )
            problem = _wire_problem(value, text)
            if problem is not None:
                return PayloadError(f"job {name!r}: field {key!r} {problem}")
        return PayloadError(f"job {name!r}: payload is not JSON-serialisable")


class JobContext:
    """What a running job knows about itself and resolves its services from.

    Constructible directly, so a test can call ``job.handle(context)`` with no
    queue at all.
    """

    __slots__ = (
        "container",
        "id",
        "queue",
        "attempt",
        "max_attempts",
        "connection",
        "name",
        "stop_requested",
        "decision",
        "batch_loader",
        "_batch",
    )

    def __init__(
        self,
        container: Container,
        id: str,
        queue: str,
        attempt: int,
        max_attempts: int,
        *,
        connection: str | None = None,
        name: str | None = None,
        stop_requested: threading.Event | None = None,
    ) -> None:
        self.container = container
        self.id = id
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.connection = connection
        self.name = name
        #: Set when the worker is stopping or this attempt's time is nearly up.
        self.stop_requested = stop_requested if stop_requested is not None else threading.Event()
        #: What :meth:`defer` or :meth:`skip` decided: ``("defer", seconds, reason)`` or ``("skip", 0.0, reason)``.
        self.decision: tuple[str, float, str] | None = None
        #: Reads this job's batch for :attr:`batch` (set by the executor for a job of a batch).
        self.batch_loader: Callable[[], Any] | None = None
        self._batch: Any = None

    @property
    def batch(self) -> Any:
        """The :class:`~rainier_sync.batch.Batch` this job belongs to, read when
        first asked for (None for a job of no batch)."""
        if self._batch is None and self.batch_loader is not None:
            self._batch = self.batch_loader()
        return self._batch

    def defer(self, seconds: float, reason: str = "") -> None:
        """Put this job back, due in ``seconds``, without spending a try (a
        middleware that finds the job cannot run now: a rate limit, a lock held).
        The attempt ends when the middleware returns without calling ``call_next``."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise ValueError(f"defer() takes a non-negative number of seconds, got {seconds!r}")
        self.decision = ("defer", float(seconds), reason)

    def skip(self, reason: str = "") -> None:
        """Acknowledge this job without running it (the attempt ends when the
        middleware returns without calling ``call_next``)."""
        self.decision = ("skip", 0.0, reason)

    @overload
    def resolve(self, key: type[T]) -> T: ...

    @overload
    def resolve(self, key: Any) -> Any: ...

    def resolve(self, key: Any) -> Any:
        return self.container.resolve(key)

    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def __repr__(self) -> str:
        return (
            f"JobContext(id={self.id!r}, name={self.name!r}, queue={self.queue!r}, "
            f"attempt={self.attempt}/{self.max_attempts})"
        )


_DATACLASS_PAYLOAD = Job.to_payload
