"""The outbox: atomic dispatch for every driver.

A dispatch ``.within(conn)`` to a connection that cannot write in the caller's
transaction (Redis, SQS, Kafka) is written to a table of the caller's own
database (:class:`Outbox`), in that transaction, and published to its
connection after the commit by a :class:`Relay` (``WorkerOptions(relay=True)``
or ``rainier-sync outbox:relay``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..drivers.database.outbox import Outbox as Outbox
    from .relay import Relay as Relay
    from .relay import RelayStats as RelayStats

__all__ = ["Outbox", "Relay", "RelayStats"]


def __getattr__(name: str) -> Any:
    if name == "Outbox":
        from ..drivers.database.outbox import Outbox

        return Outbox
    if name in ("Relay", "RelayStats"):
        from . import relay

        return getattr(relay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
