"""Dispatching inside Django's transactions.

- A ``database`` connection declared with ``alias`` writes its jobs on the
  calling thread's Django connection to that ``DATABASES`` entry: inside
  ``transaction.atomic()`` they commit or roll back with the caller's writes;
  outside, in a transaction of their own.
- A dispatch to any other deferred connection made while an ``atomic()``
  block is open is sent when the outermost block commits
  (``transaction.on_commit``), or, for a connection declared with
  ``outbox = true``, written to the outbox in the caller's transaction.
  A rolled-back transaction dispatches nothing. ``RAINIER_ON_COMMIT = False``
  sends at once instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from django.db import connections, transaction

from ..manager import QueueManager
from ..testing import FakeQueueManager

if TYPE_CHECKING:
    from ..types import QueuedJob
    from .conf import Plan, Route

__all__ = ["DjangoQueueManager", "DjangoFakeQueueManager", "open_atomic_aliases"]

log = logging.getLogger("rainier_sync")

Send = Callable[[], Any]


def open_atomic_aliases() -> list[str]:
    """The ``DATABASES`` aliases with an ``atomic()`` block open in this thread."""
    return [conn.alias for conn in connections.all(initialized_only=True) if conn.in_atomic_block]


def _at_commit(aliases: list[str], send: Send) -> None:
    """Run ``send`` once the transactions of every one of ``aliases`` committed
    (dropped when one of them rolls back)."""
    first, rest = aliases[0], aliases[1:]

    def fire() -> None:
        still_open = [alias for alias in rest if connections[alias].in_atomic_block]
        if still_open:
            _at_commit(still_open, send)
        else:
            send()

    transaction.on_commit(fire, using=first)


class _DjangoDispatch:
    """What both the real and the fake Django managers do with a dispatch."""

    _plan: Plan
    #: Whether dispatches are written to the stores (False: the fake records them).
    _writes = True
    _router: Any
    default: str | None

    def _route(self, name: str | None) -> Route | None:
        return self._plan.routes.get(name or self._plan.default or self.default or "")

    def _send(self, name: str | None, jobs: list[QueuedJob], within: Any = None) -> list[str | None]:
        parent: Callable[..., list[str | None]] = super()._send  # type: ignore[misc]
        if within is not None or self._router is not None:
            return parent(name, jobs, within)
        route = self._route(name)
        if route is None or route.inline:
            return parent(name, jobs)
        if route.alias is not None:
            if not self._writes:
                return parent(name, jobs)
            django_connection = connections[route.alias]
            if django_connection.in_atomic_block:
                django_connection.ensure_connection()
                return parent(name, jobs, django_connection.connection)
            with transaction.atomic(using=route.alias, savepoint=False):
                return parent(name, jobs, django_connection.connection)
        if route.outbox is not None and self._writes:
            outbox_connection = connections[route.outbox]
            if outbox_connection.in_atomic_block:
                outbox_connection.ensure_connection()
                return parent(name, jobs, outbox_connection.connection)
        if not self._plan.on_commit:
            return parent(name, jobs)
        waiting = open_atomic_aliases()
        if not waiting:
            return parent(name, jobs)

        def send() -> None:
            try:
                parent(name, jobs)
            except Exception:
                log.exception(
                    "dispatching %d job(s) to connection %s after the transaction committed failed",
                    len(jobs),
                    name or self.default,
                )
                raise

        _at_commit(waiting, send)
        return [job.id for job in jobs]


class DjangoQueueManager(_DjangoDispatch, QueueManager):
    """A :class:`~rainier_sync.QueueManager` booted from Django settings
    (:func:`rainier_sync.django.boot`), dispatching as described in
    :mod:`rainier_sync.django.dispatching`."""

    def __init__(self, *args: Any, plan: Plan | None = None, **kwargs: Any) -> None:
        from .conf import Plan

        super().__init__(*args, **kwargs)
        self._plan = plan if plan is not None else Plan()
        if self._plan.default is None:
            self._plan.default = self.default

    @property
    def plan(self) -> Plan:
        """How each connection's dispatches go out."""
        return self._plan

    def retarget(self, name: str, url: str) -> None:
        """Point database connection ``name`` at ``url`` (the database Django's
        connection to its alias is on now, e.g. a test database), rebuilding
        its driver from its settings when it is elsewhere."""
        from ..drivers.database import DatabaseQueue
        from ..drivers.database.url import DatabaseUrl

        old = self._connections[name]
        target = getattr(getattr(old, "_backend", None), "target", None)
        if target is None or target.url == DatabaseUrl.parse(url).url:
            return
        route = self._plan.routes[name]
        settings = {key: value for key, value in route.settings.items() if key != "outbox"}
        new = DatabaseQueue.from_url(url, **settings)
        self._connections[name] = new
        new.bind(self, name)
        if name == self.default:
            from ..locks import store_of

            self.locks = store_of(new)
        old.close()

    def aliases(self) -> dict[str, str]:
        """``{connection: DATABASES alias}`` for the database connections."""
        return {name: route.alias for name, route in self._plan.routes.items() if route.alias is not None}


class DjangoFakeQueueManager(_DjangoDispatch, FakeQueueManager):
    """The fake for Django tests: records dispatches, and defers to
    ``on_commit`` those the real manager would defer (see
    ``TestCase.captureOnCommitCallbacks(execute=True)``)."""

    _writes = False

    def __init__(self, plan: Plan | None = None, **kwargs: Any) -> None:
        from .conf import Plan

        super().__init__(**kwargs)
        self._plan = plan if plan is not None else Plan()
