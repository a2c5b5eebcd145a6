"""Records as a consumer holds them: a job read from a topic, its state, the
receipt a worker settles it by, and the path of a record that cannot be read
as a job (dead-lettered alone, or held as *stuck*)."""

from __future__ import annotations

import collections
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from ... import _clock
from ...errors import KafkaUnavailableError, PayloadError
from ...types import ExceptionInfo, QueuedJob
from .client import TP

log = logging.getLogger("rainier_sync.kafka")

# Record states.
_READY, _PARKED, _RUNNING, _WATCHED, _DONE = "ready", "parked", "running", "watched", "done"
_STUCK = "stuck"  # unreadable and not dead-lettered: never done, so never committed past


@dataclass(eq=False)
class _Record:
    part: _Partition
    offset: int
    queue: str
    job: QueuedJob  # as on the wire: ``attempts`` counts attempts before this record
    state: str = _READY
    handouts: int = 0
    lapsed: int = 0  # leases found lapsed: attempts whose worker died
    owner: str = ""
    lease_until: float = 0.0
    parked_since: float = 0.0
    next_check: float = 0.0
    key: str = ""
    marked: bool = False  # its done marker is written
    marked_at: float = 0.0  # when the marker was written or last renewed (_clock.now, as leases)

    def __lt__(self, other: _Record) -> bool:  # heap tie-break
        return self.offset < other.offset


@dataclass(frozen=True)
class _Receipt:
    record: _Record
    handout: int


@dataclass
class _Expect:
    """The last offset, per partition, known to be on the broker (written or seen)."""

    offsets: dict[TP, int] = field(default_factory=dict)

    def note(self, tp: TP, offset: int) -> None:
        if offset > self.offsets.get(tp, -1):
            self.offsets[tp] = offset


def _check_attempts(job: QueuedJob) -> None:
    """Refuse an envelope whose attempt counts no dispatch or retry could have written."""
    if job.max_attempts < 1:
        raise PayloadError(f"job {job.name!r} ({job.id}): max_attempts {job.max_attempts} is below 1")
    if not 0 <= job.attempts <= job.max_attempts:
        raise PayloadError(
            f"job {job.name!r} ({job.id}): attempts {job.attempts} is outside 0..max_attempts ({job.max_attempts})"
        )


def read_job(value: bytes | None, connection: str) -> QueuedJob:
    """The job a record's value holds; raises whatever makes it unreadable."""
    if value is None:
        raise PayloadError("a record with no value (a tombstone) is not a job")
    job = QueuedJob.decode(value, connection=connection)
    _check_attempts(job)
    return job


def unreadable_id(topic: str, partition: int, offset: int) -> str:
    """The id an unreadable record goes by: in the failed store, and while it is stuck."""
    return f"unreadable-{topic}-{partition}-{offset}"


def stuck_record(part: _Partition, offset: int, queue: str) -> _Record:
    """An unreadable record the dead-letter topic refused: it holds its
    partition's commit, so it is read (and discarded) again after a restart or
    rebalance."""
    stuck = QueuedJob(id=unreadable_id(part.tp[0], part.tp[1], offset), name="", queue=queue, payload={})
    return _Record(part, offset, queue, stuck, state=_STUCK)


def dead_letter(
    source: tuple[str, int, int],
    queue: str,
    value: bytes | None,
    exc: Exception,
    *,
    announce: Callable[[ExceptionInfo, str | None], None],
    store: Callable[[dict[str, Any]], None],
) -> bool:
    """A record that cannot be read as a job: announce it, dead-letter it
    (``store`` writes the dead letter), move on. False when the dead-letter topic
    refused it, with and without its raw value."""
    topic, partition, offset = source
    raw = value.decode("utf-8", "replace") if value is not None else None
    info = ExceptionInfo.from_exception(exc)
    log.error("kafka: discarding unreadable record %s[%d]@%d: %s", topic, partition, offset, info.error)
    announce(info, raw)
    failed: dict[str, Any] = {
        "id": unreadable_id(topic, partition, offset),
        "name": "",
        "queue": queue,
        "payload": {},
        "error": info.error,
        "exception": info.to_dict(),
        "failed_at": _clock.now(),
        "raw": raw,
        "source": [topic, partition, offset],
    }
    try:
        store(failed)
        return True
    except KafkaUnavailableError as produce_error:
        log.error("kafka: could not dead-letter %s[%d]@%d: %s", topic, partition, offset, produce_error)
        return False
    except Exception as produce_error:  # noqa: BLE001 - refused (too large?): try once without the raw text
        log.warning("kafka: dead letter of %s[%d]@%d refused (%s); storing it without its raw value",
                    topic, partition, offset, produce_error)
    failed["raw"] = None
    failed["raw_dropped"] = f"{len(value or b'')} bytes, refused by the broker inside a dead letter"
    try:
        store(failed)
    except Exception as produce_error:  # noqa: BLE001 - never lose it: the caller holds the commit back
        log.error("kafka: could not dead-letter %s[%d]@%d: %s", topic, partition, offset, produce_error)
        return False
    return True


class _Partition:
    """What one consumer knows about one assigned partition, for one assignment."""

    __slots__ = ("tp", "records", "settled", "read_to", "committed", "suspect_to", "reach")

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
        #: The partition's *reach* as stored in the lock store (no record at or past it
        #: was handed out by any owner); None until read.
        self.reach: int | None = None

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
