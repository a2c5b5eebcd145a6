"""Run a job only once per key, whichever copy of it comes first.

Work the library dispatches on a user's behalf (a schedule's tick, a chain's
next link) is dispatched first and claimed after, so a crash between the two
loses nothing; a crash or a race can then leave two copies of one piece of
work. Such a job carries ``meta["once"]``, a key in the lock store: when it
runs, it takes the key with its id as owner if the key is free, and runs only
if the key is its own; any other copy is skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .jobs import Job, JobContext
    from .state.base import Locks

__all__ = ["OnceGuard", "DEFAULT_HOLD"]

#: How long a key is held when the job names no ``hold``: a week.
DEFAULT_HOLD = 7 * 86400.0


class OnceGuard:
    """The middleware the executor puts first for a job that carries ``meta["once"]``."""

    def __init__(self, store: Locks | None, meta: dict[str, Any]) -> None:
        self.store = store
        self.key = str(meta.get("once") or meta.get("tick") or "")
        hold = meta.get("hold", DEFAULT_HOLD)
        self.hold = (
            float(hold)
            if isinstance(hold, (int, float)) and not isinstance(hold, bool) and hold > 0
            else (DEFAULT_HOLD)
        )

    def handle(self, job: Job, context: JobContext, call_next: Callable[[], None]) -> None:
        if self.store is None:
            call_next()  # nothing to ask: only a manager with a lock store dispatches such jobs
            return
        owner = self.store.owner(self.key)
        if owner is None and self.store.acquire(self.key, context.id, self.hold):
            owner = context.id
        if owner is None:
            owner = self.store.owner(self.key)
        if owner != context.id:
            context.skip(f"{self.key} is done by job {owner}")
            return
        call_next()
