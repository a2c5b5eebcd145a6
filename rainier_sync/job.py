"""The job contract and the context a running job sees."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from . import backoff as _backoff
from .errors import PayloadError
from .types import encode

if TYPE_CHECKING:
    from .container import Container

__all__ = ["Job", "JobContext"]

T = TypeVar("T")
J = TypeVar("J", bound="Job")

_DEFAULT_BACKOFF = _backoff.exponential(base=1, cap=64)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


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
    """

    NAME: ClassVar[str]
    QUEUE: ClassVar[str] = "default"
    TRIES: ClassVar[int] = 1
    TIMEOUT: ClassVar[float | None] = None
    PRIORITY: ClassVar[int] = 0
    UNIQUE_FOR: ClassVar[float] = 3600
    BACKOFF: ClassVar[Any] = None
    MEMORY_LIMIT: ClassVar[int | None] = None

    def handle(self, context: JobContext) -> None:
        """Do the work. Raising fails the attempt."""
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
        that cannot be serialised."""
        payload = self.to_payload()
        if not isinstance(payload, dict):
            raise PayloadError(f"{type(self).__qualname__}.to_payload() must return a dict")
        try:
            return payload, encode(payload)
        except (TypeError, ValueError) as exc:
            name = getattr(type(self), "NAME", type(self).__qualname__)
            for key, value in payload.items():
                try:
                    encode(value)
                except (TypeError, ValueError) as field_exc:
                    raise PayloadError(
                        f"job {name!r}: field {key!r} is not JSON-serialisable ({type(value).__name__}): {field_exc}"
                    ) from None
            raise PayloadError(f"job {name!r}: payload is not JSON-serialisable: {exc}") from None


class JobContext:
    """What a running job knows about itself and resolves its services from.

    Constructible directly, so a test can call ``job.handle(context)`` with no
    queue at all.
    """

    __slots__ = ("container", "id", "queue", "attempt", "max_attempts", "connection", "name", "stop_requested")

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
