"""The library's one clock.

Every "now" the library reads (when a job is due, when a reservation lapses)
comes from :func:`now`, so ``freezegun`` moves all of them together.

freezegun hands real time to calls made within a few frames of a module on
its ignore list, and ``threading`` is on that list by default: a worker
thread's loop would read real time while the test has frozen it. So when
freezegun is active this clock asks freezegun's own time factory, which has
no such exemption. freezegun is never imported here; it is only consulted
when the test process already has it loaded.
"""

from __future__ import annotations

import calendar
import sys
import time
from datetime import datetime, timezone

__all__ = ["now", "now_datetime", "monotonic"]

# Held in a dict so freezegun's module scan does not swap it for its fake.
_REAL = {"monotonic": time.monotonic}


def now() -> float:
    """Seconds since the epoch, as frozen time says when freezegun is active."""
    api = sys.modules.get("freezegun.api")
    if api is not None:
        factories = getattr(api, "freeze_factories", None)
        if factories:
            frozen: datetime = factories[-1]()
            return calendar.timegm(frozen.timetuple()) + frozen.microsecond / 1_000_000
    return time.time()


def now_datetime() -> datetime:
    """:func:`now` as an aware UTC datetime."""
    return datetime.fromtimestamp(now(), tz=timezone.utc)


def monotonic() -> float:
    """Real monotonic seconds, for intervals the library measures for itself
    (heartbeats, idle waits), which frozen time must not stall."""
    return _REAL["monotonic"]()
