"""Job middleware: what wraps each attempt of a job.

A job lists its middleware in :meth:`~rainier_sync.Job.middleware`, outermost
first. Each is an object with ``handle(job, context, call_next)``:
``call_next()`` runs the rest of the chain and then the job's ``handle``; a
middleware that finds the job cannot run now calls ``context.defer(seconds,
reason)`` (the job goes back without spending a try) or ``context.skip(reason)``
(it is acknowledged unrun) and returns without calling ``call_next``.

The built-ins keep their state in the manager's lock store, so every worker
that shares the store shares the limit; every time comparison reads the
library's clock, so ``freezegun`` moves their windows. A store that fails
defers the job with a short backoff: never lost, never run past its limit.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ._allowance import allowance
from ._checks import check_number
from .errors import ConfigurationError
from .state.base import STORE_HINT

if TYPE_CHECKING:
    from .jobs import Job, JobContext
    from .state.base import LockStore

__all__ = ["Middleware", "RateLimited", "WithoutOverlapping", "ThrottlesExceptions", "Skip", "StoreBacked"]

log = logging.getLogger("rainier_sync")

#: Seconds a job is deferred when the lock store could not be asked (then doubled, to a minute).
STORE_RETRY = 1.0


class Middleware(Protocol):
    """What a job's :meth:`~rainier_sync.Job.middleware` returns: objects with ``handle``."""

    def handle(self, job: Job, context: JobContext, call_next: Callable[[], None]) -> None: ...


class StoreBacked:
    """A middleware whose state lives in the lock store the worker is given.

    The worker hands it the store before each attempt (:attr:`store`); a worker
    whose jobs use one and that has no lock store refuses to start, naming ``locks``.
    """

    store: LockStore | None = None

    def _locks(self) -> LockStore:
        if self.store is None:
            raise ConfigurationError(
                f"{type(self).__name__} keeps its state in a lock store, and none is configured: {STORE_HINT}"
            )
        return self.store

    @staticmethod
    def _store_failed(context: JobContext, what: str, exc: Exception) -> None:
        """Defer the job with a backoff: the store could not say whether it may run."""
        delay = min(STORE_RETRY * 2 ** max(0, context.attempt - 1), 60.0) * random.uniform(1.0, 1.5)
        log.warning("job %s (%s): the lock store failed (%s: %s); deferred %.1fs", context.id, context.name, what,
                    exc, delay)  # fmt: skip
        context.defer(delay, f"the lock store failed: {exc}")


class RateLimited(StoreBacked):
    """At most ``limit`` attempts start within any ``per`` seconds, across every
    worker that shares the lock store; the rest are deferred until the window
    has room, each into a room of its own. A worker takes starts from the store
    several at a time when its threads need them (see :mod:`rainier_sync._allowance`)."""

    def __init__(self, name: str, limit: int, per: float) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"RateLimited name must be a non-empty string, got {name!r}")
        self.name = name
        self.limit = int(check_number("RateLimited limit", limit, whole=True, error=ValueError))
        self.per = float(check_number("RateLimited per", per, error=ValueError))

    def handle(self, job: Job, context: JobContext, call_next: Callable[[], None]) -> None:
        try:
            wait = allowance(self._locks(), f"rate:{self.name}", self.limit, self.per).acquire()
        except ConfigurationError:
            raise
        except Exception as exc:  # noqa: BLE001 - deferred, never run past the limit
            self._store_failed(context, "rate limit", exc)
            return
        if wait > 0:
            context.defer(wait, f"rate limit {self.name!r}: {self.limit} per {self.per:g}s")
            return
        call_next()

    def __repr__(self) -> str:
        return f"RateLimited({self.name!r}, limit={self.limit}, per={self.per:g})"


class WithoutOverlapping(StoreBacked):
    """Two jobs of one ``NAME`` and ``key`` never run at once: the later one is
    deferred by ``release_after`` seconds; a dead holder's lock lapses after
    ``expire_after`` seconds."""

    def __init__(self, key: str = "", expire_after: float = 3600, release_after: float = 5) -> None:
        if not isinstance(key, str):
            raise ValueError(f"WithoutOverlapping key must be a string, got {key!r}")
        self.key = key
        self.expire_after = float(check_number("WithoutOverlapping expire_after", expire_after, error=ValueError))
        self.release_after = float(
            check_number("WithoutOverlapping release_after", release_after, zero=True, error=ValueError)
        )

    def handle(self, job: Job, context: JobContext, call_next: Callable[[], None]) -> None:
        store = self._locks()
        lock = f"overlap:{type(job).NAME}:{self.key}"
        try:
            taken = store.acquire(lock, context.id, self.expire_after)
        except Exception as exc:  # noqa: BLE001 - deferred, never run beside another
            self._store_failed(context, "overlap lock", exc)
            return
        if not taken:
            context.defer(self.release_after, f"another {type(job).NAME} with key {self.key!r} is running")
            return
        try:
            call_next()
        finally:
            try:
                store.release(lock, context.id)
            except Exception as exc:  # noqa: BLE001 - it lapses after expire_after
                log.warning("could not release overlap lock %s: %s", lock, exc)

    def __repr__(self) -> str:
        times = f"expire_after={self.expire_after:g}, release_after={self.release_after:g}"
        return f"WithoutOverlapping({self.key!r}, {times})"


class ThrottlesExceptions(StoreBacked):
    """After ``max_exceptions`` failed attempts within ``decay`` seconds (of jobs
    sharing ``key``, by default the job's ``NAME``), those jobs are deferred until
    ``decay`` seconds after the last failure; a success resets the count."""

    def __init__(self, max_exceptions: int, decay: float, key: str | None = None) -> None:
        self.max_exceptions = int(
            check_number("ThrottlesExceptions max_exceptions", max_exceptions, whole=True, error=ValueError)
        )
        self.decay = float(check_number("ThrottlesExceptions decay", decay, error=ValueError))
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"ThrottlesExceptions key must be a non-empty string or None, got {key!r}")
        self.key = key

    def handle(self, job: Job, context: JobContext, call_next: Callable[[], None]) -> None:
        from . import _clock

        store = self._locks()
        counter = f"throttle:{self.key or type(job).NAME}"
        try:
            failures, lapses = store.counted(counter)
        except Exception as exc:  # noqa: BLE001 - deferred until the store answers
            self._store_failed(context, "exception throttle", exc)
            return
        if failures >= self.max_exceptions:
            context.defer(max(0.0, lapses - _clock.now()), f"{failures} failures within {self.decay:g}s")
            return
        try:
            call_next()
        except Exception:
            try:
                store.count(counter, self.decay)
            except Exception as exc:  # noqa: BLE001 - the attempt's own failure is the one to report
                log.warning("could not count a failure under %s: %s", counter, exc)
            raise
        if failures and context.decision is None:
            try:
                store.reset(counter)
            except Exception as exc:  # noqa: BLE001 - the count lapses after decay
                log.warning("could not reset %s after a success: %s", counter, exc)

    def __repr__(self) -> str:
        return f"ThrottlesExceptions({self.max_exceptions}, decay={self.decay:g}, key={self.key!r})"


class Skip:
    """Acknowledge the job unrun when a predicate on the job says so:
    ``Skip.when(lambda job: job.account_id == 0)``, ``Skip.unless(...)``."""

    def __init__(self, predicate: Callable[[Any], bool], *, skip_if: bool, label: str) -> None:
        if not callable(predicate):
            raise ValueError(f"Skip.{label} needs a callable predicate on the job, got {predicate!r}")
        self.predicate = predicate
        self.skip_if = skip_if
        self.label = label

    @classmethod
    def when(cls, predicate: Callable[[Any], bool]) -> Skip:
        """Skip the job when ``predicate(job)`` is true."""
        return cls(predicate, skip_if=True, label="when")

    @classmethod
    def unless(cls, predicate: Callable[[Any], bool]) -> Skip:
        """Skip the job unless ``predicate(job)`` is true."""
        return cls(predicate, skip_if=False, label="unless")

    def handle(self, job: Job, context: JobContext, call_next: Callable[[], None]) -> None:
        if bool(self.predicate(job)) == self.skip_if:
            context.skip(f"Skip.{self.label}({getattr(self.predicate, '__name__', 'predicate')})")
            return
        call_next()

    def __repr__(self) -> str:
        return f"Skip.{self.label}({self.predicate!r})"


def probe(job_class: type[Job]) -> list[Any] | None:
    """What ``job_class``'s middleware() returns for an instance built from its
    field defaults (None for fields without one), or None when it cannot tell:
    enough to refuse a broken chain at registration, and a worker with no lock
    store whose jobs need one, before the first job arrives."""
    import dataclasses

    from .jobs import Job

    if job_class.middleware is Job.middleware:
        return []
    try:
        instance = job_class.__new__(job_class)
        if dataclasses.is_dataclass(job_class):
            for field in dataclasses.fields(job_class):
                if field.default is not dataclasses.MISSING:
                    value: Any = field.default
                elif field.default_factory is not dataclasses.MISSING:
                    value = field.default_factory()
                else:
                    value = None
                object.__setattr__(instance, field.name, value)
        chain = instance.middleware()
    except Exception:  # noqa: BLE001 - it needs real field values: checked on the first real job
        return None
    return list(chain) if isinstance(chain, (list, tuple)) else None
