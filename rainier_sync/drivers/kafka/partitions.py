"""Per-partition bookkeeping: which records a consumer read from one
partition, which are done, and the offset it may commit."""

from __future__ import annotations

import collections
import itertools

from .client import TP
from .records import _DONE, _Record


class _Partition:
    """What one consumer knows about one assigned partition, for one assignment."""

    __slots__ = ("tp", "records", "settled", "read_to", "committed", "suspect_to")

    def __init__(self, tp: TP) -> None:
        self.tp = tp
        self.records: collections.deque[_Record] = collections.deque()
        #: Done records below the commit point, kept until the broker confirms a commit past them.
        self.settled: collections.deque[_Record] = collections.deque()
        self.read_to = -1  # offset after the last record read
        self.committed = -1  # as confirmed by the broker
        #: Records below this offset may have run under an earlier owner: their done
        #: markers are checked even when their leases are free (until the end offset is known: all).
        self.suspect_to = 1 << 62

    def commit_point(self) -> int:
        """The offset below which every record read is done (-1: nothing read)."""
        records = self.records
        while records and records[0].state == _DONE:
            self.settled.append(records.popleft())
        return records[0].offset if records else self.read_to

    def confirm(self, offset: int) -> None:
        """The broker confirmed a commit of ``offset``."""
        if offset > self.committed:
            self.committed = offset
        settled = self.settled
        while settled and settled[0].offset < offset:
            settled.popleft()

    def finished(self) -> list[_Record]:
        """Jobs run here and done, whose commit is not confirmed."""
        return [r for r in itertools.chain(self.settled, self.records) if r.state == _DONE and r.handouts]
