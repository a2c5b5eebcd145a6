"""The registry that turns a name on the wire back into a job class."""

from __future__ import annotations

from typing import Iterator, TypeVar

from .errors import JobDefinitionError, UnknownJobError
from .jobs import Job, check_job_class

__all__ = ["JobRegistry"]

J = TypeVar("J", bound=type[Job])


class JobRegistry:
    """Job classes by ``NAME``. ``register`` also works as a class decorator."""

    def __init__(self) -> None:
        self._jobs: dict[str, type[Job]] = {}
        self._keeping = False

    def register(self, job_class: J) -> J:
        if not isinstance(job_class, type) or not issubclass(job_class, Job):
            raise JobDefinitionError(f"{job_class!r} is not a subclass of rainier_sync.Job")
        name = job_class.__dict__.get("NAME", getattr(job_class, "NAME", None))
        if not isinstance(name, str) or not name.strip():
            raise JobDefinitionError(
                f"{job_class.__qualname__} has no NAME: give it a stable name for the wire, "
                f'e.g. NAME = "billing.{job_class.__name__.lower()}"'
            )
        existing = self._jobs.get(name)
        if existing is not None and existing is not job_class:
            raise JobDefinitionError(
                f"job name {name!r} is already registered to "
                f"{existing.__module__}.{existing.__qualname__}; {job_class.__module__}."
                f"{job_class.__qualname__} needs a NAME of its own"
            )
        tries = job_class.TRIES
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise JobDefinitionError(f"{job_class.__qualname__}.TRIES must be an int >= 1, got {tries!r}")
        timeout = job_class.TIMEOUT
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise JobDefinitionError(
                f"{job_class.__qualname__}.TIMEOUT must be a positive number or None, got {timeout!r}"
            )
        memory = job_class.MEMORY_LIMIT
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0):
            raise JobDefinitionError(
                f"{job_class.__qualname__}.MEMORY_LIMIT must be a positive number of bytes or None, got {memory!r}"
            )
        check_job_class(job_class)
        from .middleware import probe

        for middleware in probe(job_class) or ():
            if not callable(getattr(middleware, "handle", None)):
                raise JobDefinitionError(
                    f"{job_class.__qualname__}.middleware() returns {middleware!r}, which has no "
                    "handle(job, context, call_next)"
                )
        self._jobs[name] = job_class
        self._keeping = self._keeping or job_class.KEEP_RESULT is not None
        return job_class

    def with_job(self, job_class: type[Job]) -> JobRegistry:
        """Register and return the registry, for chaining."""
        self.register(job_class)
        return self

    def get(self, name: str) -> type[Job]:
        try:
            return self._jobs[name]
        except KeyError:
            raise UnknownJobError(
                f"no job named {name!r} is registered; register its class with JobRegistry.register()"
            ) from None

    def find(self, name: str) -> type[Job] | None:
        """The class registered under ``name``, or None."""
        return self._jobs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def classes(self) -> list[type[Job]]:
        return list(self._jobs.values())

    def keeping_results(self) -> bool:
        """Whether any registered class keeps its results (``KEEP_RESULT``)."""
        return self._keeping

    def needing_a_store(self) -> list[type[Job]]:
        """The registered classes whose middleware keeps state in a lock store."""
        from .middleware import StoreBacked, probe

        return [
            cls
            for cls in self._jobs.values()
            if cls.KEEP_RESULT is not None or any(isinstance(m, StoreBacked) for m in probe(cls) or ())
        ]
