"""Function jobs: ``@job(name, **options)`` turns a module-level function into a
:class:`~rainier_sync.Job` class.

Calling the decorated function builds a job (nothing runs); its arguments,
bound by the function's signature, are the payload. The class works wherever
a ``Job`` class does, because it is one.
"""

from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence, TypeVar

from .errors import JobDefinitionError, PayloadError
from .jobs import Job, JobContext, check_job_class

if TYPE_CHECKING:
    from .pending import PendingDispatch

__all__ = ["job", "FunctionJob"]

F = TypeVar("F", bound="FunctionJob")

#: ``job()``'s options and the class attribute each sets.
OPTIONS = {
    "queue": "QUEUE",
    "tries": "TRIES",
    "timeout": "TIMEOUT",
    "priority": "PRIORITY",
    "unique_for": "UNIQUE_FOR",
    "backoff": "BACKOFF",
    "memory_limit": "MEMORY_LIMIT",
    "keep_result": "KEEP_RESULT",
}
_OTHER_OPTIONS = ("middleware", "unique_id", "takes_context")

#: Every name a function job holds, and the function it holds it for.
_TAKEN: dict[str, str] = {}
_TAKEN_LOCK = threading.Lock()


class FunctionJob(Job):
    """A job whose work is a function; made by :func:`job`.

    Its instances hold the arguments they were built with: ``job.invoice_id``
    reads one (the function's default when it was not given).
    """

    FUNCTION: ClassVar[Callable[..., Any]]
    SIGNATURE: ClassVar[inspect.Signature]
    TAKES_CONTEXT: ClassVar[bool] = False
    MIDDLEWARE: ClassVar[Sequence[Any] | Callable[[Any], list[Any]]] = ()
    UNIQUE_ID: ClassVar[Callable[[Any], str | None] | None] = None

    __slots__ = ("arguments", "_encoded")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        try:
            bound = cls.SIGNATURE.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{cls.__qualname__}(): {exc}") from None
        self.arguments: dict[str, Any] = dict(bound.arguments)
        # Refused here, at the call, naming the argument: never at dispatch or run time.
        self._encoded: tuple[dict[str, Any], str] | None = None
        self._encoded = self.encoded_payload()

    def __getattr__(self, name: str) -> Any:
        try:
            arguments = object.__getattribute__(self, "arguments")
        except AttributeError:
            raise AttributeError(name) from None
        if name in arguments:
            return arguments[name]
        parameter = type(self).SIGNATURE.parameters.get(name)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
        raise AttributeError(f"{type(self).__qualname__} has no argument {name!r}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.arguments == self.arguments

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        given = ", ".join(f"{name}={value!r}" for name, value in self.arguments.items())
        return f"{type(self).__qualname__}({given})"

    def to_payload(self) -> dict[str, Any]:
        return dict(self.arguments)

    def encoded_payload(self) -> tuple[dict[str, Any], str]:
        if self._encoded is not None:
            return self._encoded
        return super().encoded_payload()

    @classmethod
    def from_payload(cls: type[F], payload: dict[str, Any]) -> F:
        unknown = [name for name in payload if name not in cls.SIGNATURE.parameters]
        if unknown:
            raise PayloadError(f"job {cls.NAME!r}: payload does not fit: {cls.__qualname__}() takes no {unknown[0]!r}")
        made = cls.__new__(cls)
        made.arguments = dict(payload)
        made._encoded = None
        return made

    def call_function(self, context: JobContext | None) -> Any:
        cls = type(self)
        bound = inspect.BoundArguments(cls.SIGNATURE, self.arguments)
        if cls.TAKES_CONTEXT:
            return cls.FUNCTION(context, *bound.args, **bound.kwargs)
        return cls.FUNCTION(*bound.args, **bound.kwargs)

    def handle(self, context: JobContext) -> Any:
        return self.call_function(context)

    def middleware(self) -> list[Any]:
        chosen = type(self).MIDDLEWARE
        return list(chosen(self)) if callable(chosen) else list(chosen)

    def unique_id(self) -> str | None:
        key = type(self).UNIQUE_ID
        return None if key is None else key(self)

    # -- used on the class itself: send_invoice.dispatch(7) ------------------------------
    @classmethod
    def call(cls, *args: Any, **kwargs: Any) -> Any:
        """Run the function now, in this thread, with these arguments (checked as
        for a dispatch); a function that takes the context gets a bare one."""
        from .container import Container

        made = cls(*args, **kwargs)
        context = JobContext(Container(), "call", cls.QUEUE, 1, cls.TRIES, name=cls.NAME)
        return made.call_function(context)

    @classmethod
    def dispatch(cls, *args: Any, **kwargs: Any) -> str | None:
        """Build the job and dispatch it through :func:`rainier_sync.instance`."""
        from .manager import instance

        return instance().dispatch(cls(*args, **kwargs))

    @classmethod
    def pending(cls, *args: Any, **kwargs: Any) -> PendingDispatch:
        """``instance().pending(job)`` for the job these arguments build."""
        from .manager import instance

        return instance().pending(cls(*args, **kwargs))


def _refuse(function: Any, why: str) -> JobDefinitionError:
    where = getattr(function, "__qualname__", repr(function))
    return JobDefinitionError(f"@job cannot make a job of {where}: {why}")


def job(name: str, **options: Any) -> Callable[[Callable[..., Any]], type[FunctionJob]]:
    """Turn a module-level function into a job class named ``name``.

    ``options`` are the job's class attributes in lower case (``queue``,
    ``tries``, ``timeout``, ``priority``, ``unique_for``, ``backoff``,
    ``memory_limit``, ``keep_result``), and ``middleware`` (a list, or a
    callable taking the job), ``unique_id`` (a callable taking the job) and
    ``takes_context`` (the function's first parameter is the
    :class:`~rainier_sync.JobContext`).
    """
    if not isinstance(name, str) or not name:
        raise JobDefinitionError(f"@job needs a non-empty string name for the wire, got {name!r}")
    unknown = sorted(set(options) - set(OPTIONS) - set(_OTHER_OPTIONS))
    if unknown:
        known = ", ".join([*OPTIONS, *_OTHER_OPTIONS])
        raise JobDefinitionError(f"@job({name!r}): unknown option {unknown[0]!r} (known: {known})")

    def decorate(function: Callable[..., Any]) -> type[FunctionJob]:
        if isinstance(function, type) or not inspect.isfunction(function):
            raise _refuse(function, "it is not a function")
        if function.__name__ == "<lambda>":
            raise _refuse(function, "it is a lambda; a worker finds a job's code by a module-level name")
        if "<locals>" in function.__qualname__:
            raise _refuse(function, "it is nested in another function; define it at module level")
        if "." in function.__qualname__:
            raise _refuse(function, "it is a method; a job is a module-level function or a Job class")
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise _refuse(function, "it is async; a worker runs jobs in threads")
        signature = inspect.signature(function)
        takes_context = bool(options.get("takes_context", False))
        parameters = list(signature.parameters.values())
        if takes_context:
            if not parameters or parameters[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise _refuse(function, "takes_context=True needs the context as its first positional parameter")
            parameters = parameters[1:]
        where = f"{function.__module__}.{function.__qualname__}"
        attributes: dict[str, Any] = {
            "NAME": name,
            "FUNCTION": staticmethod(function),
            "SIGNATURE": signature.replace(parameters=parameters),
            "TAKES_CONTEXT": takes_context,
            "MIDDLEWARE": options.get("middleware", ()),
            "UNIQUE_ID": staticmethod(options["unique_id"]) if options.get("unique_id") else None,
            "__module__": function.__module__,
            "__qualname__": function.__qualname__,
            "__doc__": function.__doc__,
            "__wrapped__": staticmethod(function),
            "__slots__": (),
        }
        for option, attribute in OPTIONS.items():
            if option in options:
                attributes[attribute] = options[option]
        made = type(function.__name__, (FunctionJob,), attributes)
        check_job_class(made)
        middleware = attributes["MIDDLEWARE"]
        if not callable(middleware) and not isinstance(middleware, (list, tuple)):
            raise JobDefinitionError(f"@job({name!r}): middleware must be a list or a callable taking the job")
        if attributes["UNIQUE_ID"] is not None and not callable(options["unique_id"]):
            raise JobDefinitionError(f"@job({name!r}): unique_id must be a callable taking the job")
        with _TAKEN_LOCK:
            holder = _TAKEN.get(name)
            if holder is not None and holder != where:
                raise JobDefinitionError(f"@job({name!r}) on {where}: the name is already taken by {holder}")
            _TAKEN[name] = where  # the same function decorated again (a module reloaded) keeps it
        return made

    return decorate
