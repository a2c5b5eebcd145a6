"""What every driver's declaration is checked against beyond its own spec: the
refusals all drivers share, and the suggestions a typo gets.

A driver's settings, environment variables and its own refusals are in its
:class:`~rainier_sync.drivers.spec.DriverSpec`.
"""

from __future__ import annotations

import difflib

from ..drivers.spec import QUEUE_DECOY, DriverSpec

__all__ = ["refusal", "suggest"]

_POOLS = ("no driver here pools connections", "nothing")


def refusal(spec: DriverSpec, key: str) -> tuple[str, str] | None:
    """Why ``key`` cannot be honoured on a connection of ``spec``'s driver and
    what to write instead, or None when it is not a refused declaration."""
    own = spec.refusals.get(key)
    if own is not None:
        return own
    if key == "retry_after":
        return (
            "it is the reservation under another name",
            f"{spec.period} (whole seconds)" if spec.period else f"nothing: {spec.name} reserves no jobs",
        )
    if key == "after_commit":
        return (
            "a connection cannot see your transaction, so there is no commit for it to wait for",
            "nothing: dispatch after your transaction commits, or on the database driver write the job in it "
            "with manager.pending(job).within(conn).send()",
        )
    if key == "block_for":
        return (
            "no driver blocks in reserve: it returns at once and the worker does the waiting",
            "nothing: the worker's own sleep (queue:work --sleep=N)",
        )
    if key == "table":
        return (
            "the queue's tables are fixed by its migrations, not named per connection",
            "nothing: run the driver's migrations (queue:migrate)",
        )
    if key in ("max_connections", "min_connections", "pool_size"):
        return _POOLS
    if key == "queue":
        return QUEUE_DECOY
    if key == "connection":
        return ("each connection is built from its own declaration and shares no client", "this driver's own settings")
    return None


def suggest(word: str, known: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest of ``known``, or ``""``."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
