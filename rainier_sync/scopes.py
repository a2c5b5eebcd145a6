"""Attempt scopes: what wraps each attempt of a job in the thread that runs its
``handle`` (a worker's thread, ``MemoryQueue.drain()``, the sync driver, a
timeout child) and its ``failed()``. Tracing adds one that makes the attempt's
span current; nothing else in the library needs one."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

if TYPE_CHECKING:
    from .types import QueuedJob

__all__ = ["add_attempt_scope", "remove_attempt_scope", "attempt_scopes"]

log = logging.getLogger("rainier_sync")

#: The scopes added, entered in this order.
_SCOPES: list[Callable[[QueuedJob], ContextManager[Any]]] = []
_NO_SCOPE: ContextManager[Any] = contextlib.nullcontext()


def add_attempt_scope(scope: Callable[[QueuedJob], ContextManager[Any]]) -> None:
    """Enter ``scope(job)`` around every attempt's ``handle`` (and ``failed()``),
    in the thread that runs it. A timeout child has the scopes added before the
    worker started (it is forked from the worker). A scope that raises on entry
    is logged and left out; it never fails the attempt."""
    if scope not in _SCOPES:
        _SCOPES.append(scope)


def remove_attempt_scope(scope: Callable[[QueuedJob], ContextManager[Any]]) -> None:
    """Stop entering ``scope``."""
    if scope in _SCOPES:
        _SCOPES.remove(scope)


def attempt_scopes(queued: QueuedJob) -> ContextManager[Any]:
    """The scopes added with :func:`add_attempt_scope`, for ``queued``, outermost first."""
    return _entered(list(_SCOPES), queued) if _SCOPES else _NO_SCOPE


@contextlib.contextmanager
def _entered(scopes: list[Callable[[QueuedJob], ContextManager[Any]]], queued: QueuedJob) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            try:
                stack.enter_context(scope(queued))
            except Exception:  # noqa: BLE001 - a listener's scope must never fail the attempt
                log.exception("an attempt scope (%r) raised on entry; ignored", scope)
        yield
