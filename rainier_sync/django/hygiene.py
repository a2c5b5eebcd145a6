"""Django connection hygiene for jobs.

Each attempt a :class:`DjangoWorker` runs sits between two
``close_old_connections()`` calls, as a request does: a connection past
``CONN_MAX_AGE``, one an error left unusable, or one whose autocommit the job
left changed is closed, and ``CONN_HEALTH_CHECKS`` checks a persistent
connection once per attempt. Nothing costs a round trip when nothing is stale,
and a connection that cannot be stale is not even called into.
With ``DEBUG`` the queries log is reset per attempt. A forked process (the
child running a timed attempt) first drops the connections it inherited from
its parent, unclosed, so their sockets stay the parent's, and opens its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import TYPE_CHECKING, Any, ContextManager

from django.conf import settings
from django.db import connections, reset_queries

from ..worker import Worker, WorkerOptions, WorkerStats

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..types import QueuedJob

__all__ = ["DjangoWorker", "attempt_hygiene", "forked_scope", "drop_inherited_connections"]

#: The process the app booted in; an attempt in any other (a fork of it) drops what it inherited.
_home: list[int] = [os.getpid()]
#: Connections inherited across a fork: kept referenced, never closed, so no
#: finaliser ever speaks on a socket the parent still uses.
_inherited: list[Any] = []


def _this_threads_connections() -> list[Any]:
    """This thread's open Django connections (what ``connections.all(initialized_only=True)``
    returns, read straight from the handler's thread-local storage where it has one)."""
    storage = getattr(connections._connections, "_storage", None)
    if isinstance(storage, threading.local):
        return list(vars(storage).values())
    return list(connections.all(initialized_only=True))


def close_old_connections() -> None:
    """``django.db.close_old_connections()``, without calling into a connection
    that cannot need it: one open, with no error since its last commit or
    rollback, its autocommit as configured, no health checks to re-arm and
    ``CONN_MAX_AGE`` not reached."""
    now = time.monotonic()
    for conn in _this_threads_connections():
        if conn.connection is None:
            continue
        if (
            not conn.errors_occurred
            and not conn.health_check_enabled
            and conn.autocommit == conn.settings_dict["AUTOCOMMIT"]
            and (conn.close_at is None or now < conn.close_at)
        ):
            continue
        conn.close_if_unusable_or_obsolete()


class _AttemptHygiene:
    """The context manager :func:`attempt_hygiene` returns (a class: it is entered for every job)."""

    __slots__ = ()

    def __enter__(self) -> None:
        if settings.DEBUG:
            reset_queries()
        close_old_connections()

    def __exit__(self, *exc_info: object) -> None:
        close_old_connections()


_HYGIENE = _AttemptHygiene()


def attempt_hygiene(queued: QueuedJob | None = None) -> ContextManager[None]:
    """Around one attempt: :func:`close_old_connections` before and after,
    ``reset_queries()`` first when ``DEBUG``."""
    return _HYGIENE


def drop_inherited_connections() -> int:
    """Forget this thread's Django connections without closing them (they are a
    parent process's); the next query opens new ones. Returns how many."""
    dropped = 0
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _inherited.append(conn.connection)
            conn.connection = None
            conn.in_atomic_block = False
            conn.needs_rollback = False
            conn.savepoint_ids = []
            conn.run_on_commit = []
            dropped += 1
    return dropped


def mark_home() -> None:
    """This process is the one whose connections are its own."""
    _home[0] = os.getpid()


def forked_scope(queued: QueuedJob) -> ContextManager[Any]:
    """The attempt scope for a forked process (a timeout child): the inherited
    connections dropped once, then :func:`attempt_hygiene`. Nothing in the
    process Django booted in."""
    pid = os.getpid()
    if pid == _home[0]:
        return contextlib.nullcontext()
    _home[0] = pid
    drop_inherited_connections()
    return attempt_hygiene(queued)


class DjangoWorker(Worker):
    """A :class:`~rainier_sync.Worker` whose attempts each run between
    ``close_old_connections()`` calls (see :mod:`rainier_sync.django.hygiene`);
    what ``manage.py queue work`` runs."""

    def __init__(
        self,
        manager: QueueManager | None = None,
        options: WorkerOptions | None = None,
        *,
        connection: str | None = None,
        **kwargs: Any,
    ) -> None:
        if manager is None:
            from .state import get_manager

            manager = get_manager()
        super().__init__(manager, options=options, connection=connection, **kwargs)
        self.executor.attempt_context = attempt_hygiene

    def run(self) -> WorkerStats:
        """Work (see :meth:`Worker.run`); this thread's Django connections are
        closed when it returns."""
        try:
            return super().run()
        finally:
            connections.close_all()
