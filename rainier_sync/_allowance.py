"""Starts taken ahead: how :class:`~rainier_sync.middleware.RateLimited` asks its
lock store once for many attempts.

A worker process keeps one :class:`Allowance` per lock store and limiter. When
a thread needs a start and the allowance has none, one thread (the others wait
for it) takes several from the store in one round trip, as many as this
process is likely to use within the allowance's *reach* (a few hundredths of
a second): the threads waiting, and the pace of recent starts; never more than
the whole limit allows in that time, so a limit near the load is taken one
start at a time and no process starves the others.

Why no window of ``per`` seconds holds more than ``limit`` starts: starts
taken at ``t0`` are counted in the store as made at ``t0 + reach + guard``,
and one not used by ``t0 + reach`` is dropped. So every start lies between
its take and its stamp (the guard covers the moment from the check to the
attempt), and it stays in every other worker's window until its stamp plus
``per``. Take any window ``[a, a + per)`` and the last take, at ``t``, of the
starts in it: each of those starts was stamped no earlier than itself, so
after ``a > t - per``; all of them were in the window the store counted at
``t``, and the store never lets that hold more than ``limit``.

A window found full is remembered until its first room, and jobs deferred in
the meantime are booked into its next rooms in turn (a backlog comes back at
the pace it can run, not all at once, and not in a hot loop): each into the
first room not yet booked, so a job that comes back before its room (the
starts before it came late) takes a room of the window it finds, and the
window stays full while there is a backlog.
"""

from __future__ import annotations

import bisect
import collections
import math
import threading
import weakref

from . import _clock
from .state.base import Windows

__all__ = ["Allowance", "SlowStore", "allowance"]

#: The longest a start taken ahead waits for its attempt, in seconds (at most ``per / 50``).
REACH = 0.02
#: How much later than its last use a start taken ahead is counted: the time
#: from the check to the attempt's start (at most ``per / 50``).
GUARD = 0.02
#: A fresh take that comes back past its reach is tried this many times, then
#: the job is deferred as for a store that failed.
TRIES = 3


class SlowStore(Exception):
    """The lock store's answers came back later than the starts they gave could be used."""


class Allowance:
    """The starts one process holds, taken ahead, under one limiter of one store."""

    def __init__(self, store: Windows, key: str, limit: int, per: float) -> None:
        self.store, self.key, self.limit, self.per = store, key, limit, per
        #: Whether the store can take several starts in one round trip, stamped ahead.
        self.batched = type(store).take_many is not Windows.take_many
        self._reach = min(REACH, per / 50)
        self._guard = min(GUARD, per / 50)
        self._ready = threading.Condition(threading.Lock())
        #: Starts taken ahead, in the order they lapse: [how many are left, usable until].
        self._groups: collections.deque[list[float]] = collections.deque()
        self._fetching = False
        self._waiting = 0
        #: Starts used since the last take began, and when it began (the pace's sample).
        self._used = 0
        self._since: float | None = None
        self._pace = 0.0
        #: Round trips to the store: their running mean, and the last one (seconds).
        self._trip = self._last_trip = 0.0
        #: The window was left full: no room before this; its next rooms (clock times).
        self._closed_until = self._crowded_until = 0.0
        self._rooms: list[float] = []
        #: When each deferred job this process booked into a room comes back (sorted).
        self._booked: list[float] = []

    def acquire(self) -> float:
        """0.0 when the attempt may start now (a start is counted for it); else
        the seconds to defer it by. Raises what the store raises, or
        :class:`SlowStore`."""
        if not self.batched:
            return self.store.take(self.key, self.limit, self.per)
        voids = 0
        while voids < TRIES:
            with self._ready:
                while True:
                    now = _clock.now()
                    left = self._held(now)
                    if left and (self._fetching or left > self._low() or now < self._closed_until):
                        self._spend()
                        return 0.0
                    if not left and now < self._closed_until:
                        return self._book(now)
                    if not self._fetching:
                        break  # this thread takes the next starts (while the others spend what is left)
                    self._waiting += 1
                    self._ready.wait(1.0)  # the fetching thread wakes us; a bound all the same
                    self._waiting -= 1
                self._fetching = True
                reach = self._stretch()
                want = self._want(reach, now)
            try:
                began = _clock.now()
                taken, rooms = self.store.take_many(self.key, want, self.limit, self.per, hold=reach + self._guard)
                back = _clock.now()
            finally:
                with self._ready:
                    self._fetching = False
                    self._ready.notify_all()
            with self._ready:
                self._learn(began, back, taken)
                if rooms:
                    # Starts taken ahead and left unused would crowd a full window: for one
                    # window, take only what is needed now.
                    self._crowded_until = began + self.per
                    # Counted from the answer, not the question: a room is then never
                    # thought open before the store read the window (a job booked into it
                    # would find it shut, and be booked again at the back).
                    self._closed_until = back + rooms[0]
                    self._rooms = [back + room for room in rooms]
                if taken and back < began + reach:
                    if taken > 1:
                        self._groups.append([taken - 1, began + reach])
                    self._used += 1
                    return 0.0
                if not taken and not self._held(back):
                    return self._book(back)
                voids += bool(taken)
        raise SlowStore(
            f"the lock store answered in {self._last_trip:.3f} s, past the {self._stretch():.3f} s its starts "
            f"can wait within a window of {self.per:g} s"
        )

    def _held(self, now: float) -> int:
        """The starts still usable at ``now`` (those past their reach are dropped)."""
        groups = self._groups
        while groups and groups[0][1] <= now:
            groups.popleft()
        return sum(int(group[0]) for group in groups)

    def _spend(self) -> None:
        group = self._groups[0]
        group[0] -= 1
        if not group[0]:
            self._groups.popleft()
        self._used += 1

    def _low(self) -> float:
        """Few enough starts left that the next thread takes more before they run out."""
        return self._pace * 2 * self._trip

    def _stretch(self) -> float:
        """The reach, longer for a store slower to answer (a start taken ahead
        must outlast the round trip that takes it), at most a quarter of ``per``."""
        return max(self._reach, min(3 * self._trip, self.per / 4))

    def _want(self, reach: float, now: float) -> int:
        if now < self._crowded_until:  # lately found full: what the waiting threads need, no more
            return min(self._waiting + 1, self.limit)
        demand = max(self._waiting + 1, math.ceil(self._pace * reach))
        return max(1, min(demand, math.ceil(self.limit * reach / self.per), self.limit))

    def _learn(self, began: float, back: float, taken: int) -> None:
        self._last_trip = max(0.0, back - began)
        self._trip = 0.7 * self._trip + 0.3 * self._last_trip
        if self._since is not None and began > self._since:
            self._pace = 0.5 * self._pace + 0.5 * self._used / (began - self._since)
        self._since, self._used = began, 0

    def _book(self, now: float) -> float:
        """The delay of a job deferred now: the first of the window's coming rooms
        that no job this process deferred is booked into yet (past the rooms the
        store named, at the limit's pace). A job back before the room it was
        booked into (the starts before it came late) so takes a room of the
        window it finds, not one behind every job booked after it."""
        booked = self._booked
        del booked[: bisect.bisect_right(booked, now)]
        hold = self._stretch() + self._guard
        # Bookings made from an earlier answer name the same room up to a round trip
        # apart; a room's bookings are those up to this much after it.
        near = min(self._guard, self.per / self.limit / 2)
        queued = counted = 0
        while True:
            due = max(self._room(queued, now, hold), self._closed_until)
            counted = bisect.bisect_right(booked, due + near, lo=counted)
            if counted <= queued:
                break
            queued = counted  # those rooms are all booked: none before this one is free
        bisect.insort(booked, due)
        return max(due - now, 1e-3)

    def _room(self, queued: int, now: float, hold: float) -> float:
        """The window's room ``queued`` rooms on from its next one."""
        rooms = self._rooms
        if not rooms:  # a store that named no room: the limit's pace from now
            return now + (queued + 1) * self.per / self.limit
        if queued < len(rooms):
            return rooms[queued]
        if len(rooms) == self.limit:
            # every room of the window named: each comes round again once the start
            # made in it (no sooner than the room) has been counted for per seconds
            return rooms[queued % self.limit] + (self.per + hold) * (queued // self.limit)
        return rooms[-1] + (queued - len(rooms) + 1) * self.per / self.limit


_allowances: weakref.WeakKeyDictionary[Windows, dict[tuple[str, int, float], Allowance]] = (
    weakref.WeakKeyDictionary()
)
_made = threading.Lock()


def allowance(store: Windows, key: str, limit: int, per: float) -> Allowance:
    """This process's allowance of ``store``'s window ``key`` (one per limit and ``per``)."""
    try:
        return _allowances[store][(key, limit, per)]
    except KeyError:
        pass
    with _made:
        held = _allowances.setdefault(store, {})
        found = held.get((key, limit, per))
        if found is None:
            found = held[(key, limit, per)] = Allowance(store, key, limit, per)
        return found
