"""The Kafka driver: one topic per queue, one consumer group per connection.

Design, in short (``docs/drivers/kafka.rst`` has the long form):

- ``<prefix><queue>`` holds jobs due now, ``<prefix><queue>.delayed`` jobs
  due later (and backed-off retries), ``<prefix><queue>.failed`` the dead
  letters. Records are keyed by job id; values are the JSON envelope.
- A worker process is one consumer. Records it reads are buffered; a job is
  handed out only after its **lease** (a lock-store key, ``lease`` seconds,
  renewed by :meth:`KafkaQueue.extend`) is taken, so a redelivered record
  whose job a live worker still runs is not run twice.
- Jobs finish out of order; per partition the driver commits only the
  offset below which every record is done, in batches.
- Delayed records are parked in memory by the consumer that reads them and
  handed out when ``_clock.now()`` says they are due; one parked longer than
  ``park_horizon`` is re-produced at the tail of its delay topic, so a
  delay partition's commit never lags more than that.
- When partitions are revoked, done-but-uncommitted jobs and jobs still
  running get a *done* marker in the lock store, which the next owner of the
  partition checks before running a job whose lease it could not take.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import logging
import re
import threading
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .. import _clock, signals
from ..errors import ConfigurationError, DriverUnavailableError, JobCrashedError, PayloadError, RainierError
from ..locks.base import LockStore
from ..types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob, as_exception_info, decode, encode
from .base import BaseQueue, QueueDriver, Waker, as_job_list

if TYPE_CHECKING:
    from ..manager import QueueManager

try:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError(
        "the Kafka driver needs confluent-kafka: pip install 'rainier_sync[kafka]'"
    ) from error

__all__ = ["KafkaQueue", "KafkaQueueError"]

log = logging.getLogger("rainier_sync.kafka")

_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")
_DELAYED, _FAILED = ".delayed", ".failed"

# Record states.
_READY, _PARKED, _RUNNING, _WATCHED, _DONE = "ready", "parked", "running", "watched", "done"
_STUCK = "stuck"  # unreadable and not dead-lettered: never done, so never committed past

TP = tuple[str, int]


class KafkaQueueError(RainierError):
    """The broker refused or lost a write (the job was not accepted)."""


class _Partition:
    """What one consumer knows about one assigned partition, for one assignment."""

    __slots__ = ("tp", "records", "read_to", "committed")

    def __init__(self, tp: TP) -> None:
        self.tp = tp
        self.records: collections.deque[_Record] = collections.deque()
        self.read_to = -1  # offset after the last record read
        self.committed = -1

    def commit_point(self) -> int:
        """The offset below which every record read is done (-1: nothing read)."""
        records = self.records
        while records and records[0].state == _DONE:
            records.popleft()
        return records[0].offset if records else self.read_to


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

    def __lt__(self, other: _Record) -> bool:  # heap tie-break
        return self.offset < other.offset


@dataclass(frozen=True)
class _Receipt:
    record: _Record
    handout: int


@dataclass
class _Expect:
    offsets: dict[TP, int] = field(default_factory=dict)

    def note(self, tp: TP, offset: int) -> None:
        if offset > self.offsets.get(tp, -1):
            self.offsets[tp] = offset


def _brokers(brokers: str | Sequence[str]) -> str:
    if isinstance(brokers, str):
        items = [b.strip() for b in brokers.split(",")]
    elif isinstance(brokers, (list, tuple)):
        items = [str(b).strip() for b in brokers]
    else:
        raise ConfigurationError(f"kafka: brokers must be 'host:port[,host:port...]' or a list, got {brokers!r}")
    items = [b for b in items if b]
    if not items:
        raise ConfigurationError("kafka: brokers is empty; give at least one 'host:port' (KAFKA_BROKERS)")
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(f"kafka: broker {item!r} is not 'host:port'")
    return ",".join(items)


class KafkaQueue(BaseQueue):
    """Jobs on Kafka topics, at least once, with leases in a shared lock store.

    ``brokers`` is the bootstrap list; ``group`` the consumer group every
    worker of this connection joins; ``topic_prefix`` goes before each queue's
    topic name; ``lease`` is the seconds a worker holds a job before another
    may run it (renewed while it runs); ``locks`` is the shared lock store
    (Redis or database) holding the leases, and is required.

    Advanced: ``partitions`` for topics the driver creates, ``park_horizon``
    (seconds a delayed record is held in memory before it is re-produced),
    ``buffer`` (records read ahead per consumer), ``commit_interval``
    (least seconds between commits; 0: after every settled batch),
    ``topic_config`` (settings of the job and delay topics it creates, e.g.
    ``{"retention.ms": "-1"}``), ``producer_config`` and ``consumer_config``
    (librdkafka settings merged over the driver's).
    """

    driver = QueueDriver.KAFKA

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        group: str = "rainier",
        topic_prefix: str = "rainier.",
        lease: float = 90,
        locks: LockStore | None = None,
        partitions: int = 4,
        park_horizon: float = 60.0,
        buffer: int = 5000,
        commit_interval: float = 0.0,
        topic_config: Mapping[str, str] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        consumer_config: Mapping[str, Any] | None = None,
    ) -> None:
        if locks is None:
            raise ConfigurationError(
                "kafka: a shared lock store is required for job leases: pass locks=RedisLockStore.from_url(...) "
                "or locks=DatabaseLockStore.from_url(...) (QueueResources(locks=...) when booting from config)"
            )
        if not isinstance(locks, LockStore):
            raise ConfigurationError(f"kafka: locks must be a LockStore, got {type(locks).__name__}")
        if not isinstance(group, str) or not group.strip():
            raise ConfigurationError(f"kafka: group must be a non-empty string, got {group!r}")
        if not isinstance(topic_prefix, str) or not _TOPIC_CHARS.match(topic_prefix):
            raise ConfigurationError(
                f"kafka: topic_prefix {topic_prefix!r} may hold only letters, digits, '.', '_' and '-'"
            )
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or lease <= 0:
            raise ConfigurationError(f"kafka: lease must be a positive number of seconds, got {lease!r}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigurationError(f"kafka: partitions must be an int >= 1, got {partitions!r}")
        if isinstance(park_horizon, bool) or not isinstance(park_horizon, (int, float)) or park_horizon <= 0:
            raise ConfigurationError(f"kafka: park_horizon must be positive seconds, got {park_horizon!r}")
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise ConfigurationError(f"kafka: buffer must be an int >= 1, got {buffer!r}")
        if isinstance(commit_interval, bool) or not isinstance(commit_interval, (int, float)) or commit_interval < 0:
            raise ConfigurationError(f"kafka: commit_interval must be seconds >= 0, got {commit_interval!r}")
        self.brokers = _brokers(brokers)
        self.group = group
        self.topic_prefix = topic_prefix
        self.lease = float(lease)
        self.reservation: float = float(lease)
        self.locks = locks
        self.partitions = partitions
        self.park_horizon = float(park_horizon)
        self.buffer = buffer
        #: Least seconds between two asynchronous commits; 0 commits after every
        #: settled batch, which keeps the jobs a crash runs again to those in flight.
        self.commit_interval = float(commit_interval)
        #: Topic settings for the job and delay topics the driver creates.
        self.topic_config = {str(k): str(v) for k, v in (topic_config or {}).items()}
        #: How long a *done* marker lives: long enough for the partition's next
        #: owner to read past the record.
        self.done_ttl = max(4 * self.lease, 600.0)
        #: Longest wait for the group to hand this consumer its partitions.
        self.join_timeout = 30.0
        #: Longest wait, in ``reserve``, for records known to be on the broker.
        self.read_wait = 3.0
        self._token = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self._lock = threading.RLock()
        self._inspect_lock = threading.Lock()
        # Back off at most 2 s between reconnects (librdkafka: 10 s), so workers
        # pick up again soon after a broker restart.
        base: dict[str, Any] = {"bootstrap.servers": self.brokers, "logger": log, "reconnect.backoff.max.ms": 2000}
        self._producer_config: dict[str, Any] = {
            **base,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            # A record is delivered or failed for good before push returns: no
            # late delivery of a job the caller was told was refused.
            "message.timeout.ms": 30_000,
            **dict(producer_config or {}),
        }
        self._flush_timeout = float(self._producer_config["message.timeout.ms"]) / 1000 + 5
        self._consumer_config: dict[str, Any] = {
            **base,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1500,
            "max.poll.interval.ms": max(300_000, int(self.lease * 2000)),
            "fetch.wait.max.ms": 50,
            "allow.auto.create.topics": False,
            **dict(consumer_config or {}),
        }
        self._producer = Producer(self._producer_config)
        self._admin = AdminClient(dict(base))
        self._consumer: Consumer | None = None
        self._inspector: Consumer | None = None
        self._topics: set[str] = set()
        self._queues: set[str] = set()
        self._assigned = threading.Event()
        self._parts: dict[TP, _Partition] = {}
        self._ready: dict[str, collections.deque[_Record]] = {}
        self._parked: dict[str, list[tuple[float, _Record]]] = {}
        self._watched: list[_Record] = []
        self._probe = False
        self._expect = _Expect()
        self._last_commit = 0.0
        self._quiet_until: dict[int, float] = {}
        self._closed = False
        self._unique_locks: LockStore | None = None

    def bind(self, manager: QueueManager, connection: str) -> None:
        super().bind(manager, connection)
        self._unique_locks = manager.locks

    @property
    def _buffered(self) -> int:
        """Records read and waiting to be handed out (parked delayed records not counted)."""
        return sum(len(ready) for ready in self._ready.values())

    def describe(self) -> str:
        return f"kafka {self.brokers} group={self.group} prefix={self.topic_prefix}"

    # -- names -------------------------------------------------------------------------
    def topic(self, queue: str) -> str:
        """The topic of ``queue``'s due jobs."""
        if not queue or not _TOPIC_CHARS.match(queue) or len(self.topic_prefix + queue) > 240:
            raise PayloadError(
                f"queue name {queue!r} cannot be a Kafka topic: use letters, digits, '.', '_' and '-' (240 at most)"
            )
        return self.topic_prefix + queue

    def _queue_of(self, topic: str) -> tuple[str, str]:
        name = topic[len(self.topic_prefix):]
        for suffix in (_DELAYED, _FAILED):
            if name.endswith(suffix):
                return name[: -len(suffix)], suffix
        return name, ""

    def _lease_key(self, job: QueuedJob) -> str:
        return f"kafka:{self.group}:{self.topic_prefix}:lease:{job.id}:{job.attempts}:{int(job.available_at * 1000)}"

    def _done_key(self, record: _Record) -> str:
        return record.key.replace(":lease:", ":done:", 1)

    # -- topics ------------------------------------------------------------------------
    def _ensure_topics(self, names: Iterable[str]) -> None:
        missing = [n for n in names if n not in self._topics]
        if not missing:
            return
        try:
            existing = set(self._admin.list_topics(timeout=10).topics)
        except KafkaException as exc:
            raise KafkaQueueError(f"kafka: brokers {self.brokers} did not answer: {exc}") from exc
        create = [n for n in missing if n not in existing]
        if create:
            futures = self._admin.create_topics(
                [self._new_topic(n) for n in create],
                operation_timeout=10,
                request_timeout=10,
            )
            for name, future in futures.items():
                try:
                    future.result()
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise KafkaQueueError(f"kafka: could not create topic {name!r}: {exc}") from exc
        self._topics.update(missing)

    def _new_topic(self, name: str) -> NewTopic:
        if name.endswith(_FAILED):
            # One partition keeps the ledger in one order; compaction keeps the
            # latest entry per job id and lets a broker drop forgotten ones.
            return NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})
        return NewTopic(name, self.partitions, 1, config=dict(self.topic_config))

    def _list_topics(self) -> list[str]:
        return [t for t in self._admin.list_topics(timeout=10).topics if t.startswith(self.topic_prefix)]

    # -- producing -----------------------------------------------------------------------
    def _produce(self, records: Sequence[tuple[str, str, bytes | None]], acked: set[int] | None = None) -> None:
        """Write ``(topic, key, value)`` records; returns once every one is
        acknowledged by the broker (acks=all), else raises naming how many failed.
        ``acked`` collects the indexes of the records the broker acknowledged."""
        self._ensure_topics({t for t, _, _ in records})
        failures: list[str] = []
        pending = [len(records)]
        expect = self._expect

        def delivered(index: int, err: Any, msg: Message) -> None:
            pending[0] -= 1
            if err is not None:
                failures.append(f"{msg.topic()} key={msg.key()!r}: {err}")
            else:
                if acked is not None:
                    acked.add(index)
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is not None and partition is not None and offset is not None:
                    expect.note((topic, partition), offset)

        producer = self._producer
        for index, (topic, key, value) in enumerate(records):
            while True:
                try:
                    producer.produce(topic, value=value, key=key.encode(),
                                     on_delivery=functools.partial(delivered, index))
                    break
                except BufferError:
                    producer.poll(0.05)
        left = producer.flush(self._flush_timeout)
        if left or pending[0] > 0:
            raise KafkaQueueError(
                f"kafka: {pending[0]} record(s) not acknowledged by the broker within {self._flush_timeout:.0f}s"
            )
        if failures:
            raise KafkaQueueError(f"kafka: {len(failures)} record(s) refused: {failures[0]}")

    def _job_record(self, job: QueuedJob, now: float) -> tuple[str, str, bytes]:
        topic = self.topic(job.queue)
        if job.available_at > now:
            topic += _DELAYED
        return topic, job.id, job.encode().encode()

    def push(self, job: QueuedJob) -> str:
        self.push_many([job])
        return job.id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        if not jobs:
            return []
        now = _clock.now()
        self._produce([self._job_record(job, now) for job in jobs])
        return [job.id for job in jobs]

    # -- the consumer ------------------------------------------------------------------------
    def _consumer_for(self, queues: Sequence[str]) -> Consumer:
        """The group consumer, subscribed to every queue asked for so far."""
        wanted = set(queues) - self._queues
        if wanted or self._consumer is None:
            for queue in wanted:
                self.topic(queue)
            self._queues |= wanted
            topics = tuple(sorted(t for q in self._queues for t in (self.topic(q), self.topic(q) + _DELAYED)))
            self._ensure_topics(topics)
            if self._consumer is None:
                self._consumer = Consumer(self._consumer_config)
            self._assigned.clear()
            self._consumer.subscribe(
                list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
            deadline = _clock.monotonic() + self.join_timeout
            while not self._assigned.is_set() and _clock.monotonic() < deadline:
                self._take_in(self._consumer.poll(0.05))
        return self._consumer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._parts[(tp.topic, tp.partition)] = _Partition((tp.topic, tp.partition))
        self._probe = True
        self._assigned.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(consumer, partitions, lost=False)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(consumer, partitions, lost=True)

    def _let_go(self, consumer: Consumer, partitions: list[TopicPartition], *, lost: bool) -> None:
        """Partitions leave this consumer: commit what is done (unless lost), and
        mark done-but-uncommitted jobs so the next owner does not run them again.
        Jobs still running finish here and mark themselves done (see _finish)."""
        offsets: list[TopicPartition] = []
        finished: list[_Record] = []
        for tp in partitions:
            part = self._parts.pop((tp.topic, tp.partition), None)
            self._expect.offsets.pop((tp.topic, tp.partition), None)
            if part is None:
                continue
            point = part.commit_point()
            if point >= 0:  # even if committed before: an asynchronous commit may have failed
                offsets.append(TopicPartition(tp.topic, tp.partition, point))
            # Only jobs run here: a parked record re-produced at the tail shares
            # its key with the copy, which must still run.
            finished.extend(r for r in part.records if r.state == _DONE and r.handouts)
        if offsets and not lost:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("kafka: commit on revoke failed (the next owner re-reads those records): %s", exc)
        for record in finished:
            self._mark_done(record)
        self._forget_stale()

    def _forget_stale(self) -> None:
        """Drop buffered records of partitions no longer ours (the next owner re-reads them)."""
        for queue, ready in self._ready.items():
            self._ready[queue] = collections.deque(r for r in ready if self._live(r) and r.state == _READY)
        for queue, parked in self._parked.items():
            kept = [(at, r) for at, r in parked if self._live(r) and r.state == _PARKED]
            heapq.heapify(kept)
            self._parked[queue] = kept
        self._watched = [r for r in self._watched if self._live(r)]

    def _mark_done(self, record: _Record) -> None:
        """For a job done on a partition that is (or is about to be) someone
        else's: a *done* marker, and the lease held as long, so whoever reads
        the record again finds the lease taken and, watching, the marker."""
        try:
            self.locks.acquire(self._done_key(record), self._token, self.done_ttl)
            if record.owner:
                self.locks.renew(record.key, record.owner, self.done_ttl)
        except Exception as exc:  # noqa: BLE001 - the lease still protects it until it lapses
            log.warning("kafka: could not mark job %s done in the lock store: %s", record.job.id, exc)

    def _live(self, record: _Record) -> bool:
        return self._parts.get(record.part.tp) is record.part

    def _take_in(self, msg: Message | None) -> None:
        """Buffer one record read from the consumer."""
        if msg is None:
            return
        err = msg.error()
        if err is not None:
            now = _clock.monotonic()
            if err.code() != KafkaError._PARTITION_EOF and now >= self._quiet_until.get(err.code(), 0.0):
                # librdkafka reconnects by itself; say so once in a while, not on every poll.
                self._quiet_until[err.code()] = now + 30.0
                log.warning("kafka: consumer error (retrying): %s", err)
            return
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            return
        part = self._parts.get((topic, partition))
        if part is None:
            return  # a partition already revoked
        part.read_to = offset + 1
        queue, kind = self._queue_of(topic)
        value = msg.value()
        try:
            if value is None:
                raise PayloadError("a record with no value (a tombstone) is not a job")
            job = QueuedJob.decode(value, connection=self.connection)
        except (PayloadError, ValueError) as exc:
            if not self._discard(topic, partition, offset, queue, value, exc):
                # Not dead-lettered: hold the partition's commit here, so the
                # record is read (and discarded) again after a restart or rebalance.
                stuck = QueuedJob(id=f"unreadable-{topic}-{partition}-{offset}", name="", queue=queue, payload={})
                part.records.append(_Record(part, offset, queue, stuck, state=_STUCK))
            return
        record = _Record(part, offset, queue, job, key=self._lease_key(job))
        part.records.append(record)
        if kind == _DELAYED and job.available_at > _clock.now():
            record.state = _PARKED
            record.parked_since = _clock.now()
            heapq.heappush(self._parked.setdefault(queue, []), (job.available_at, record))
        else:
            self._ready.setdefault(queue, collections.deque()).append(record)

    def _discard(self, topic: str, partition: int, offset: int, queue: str, value: bytes | None,
                 exc: Exception) -> bool:
        """A record that is not our JSON: announce it, dead-letter it, move on.
        False when the dead-letter topic refused it."""
        raw = value.decode("utf-8", "replace") if value is not None else None
        info = ExceptionInfo.from_exception(exc)
        log.error("kafka: discarding unreadable record %s[%d]@%d: %s", topic, partition, offset, info.error)
        self.announce_discarded(info, raw)
        failed = {
            "id": f"unreadable-{topic}-{partition}-{offset}",
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
            self._produce([(self.topic(queue) + _FAILED, str(failed["id"]), encode({"failed": failed}).encode())])
        except Exception as produce_error:  # noqa: BLE001 - never lose it: the caller holds the commit back
            log.error("kafka: could not dead-letter %s[%d]@%d: %s", topic, partition, offset, produce_error)
            return False
        return True

    def _pull(self, consumer: Consumer, wait: float) -> int:
        """Read what the consumer has (waiting up to ``wait`` for the first record),
        up to ``buffer`` records ready; librdkafka's own prefetch holds the rest.
        (Pausing partitions instead costs a refetch of tens of milliseconds.)"""
        if self._buffered >= self.buffer:
            # Still poll, taking at most one record: that serves rebalances and
            # keeps max.poll.interval.ms satisfied.
            batch = consumer.consume(1, timeout=0)
            for record in batch:
                self._take_in(record)
            return len(batch)
        got = 0
        if wait > 0:
            msg = consumer.poll(wait)
            if msg is None:
                return 0
            self._take_in(msg)
            got += 1
        while self._buffered < self.buffer:
            batch = consumer.consume(min(500, self.buffer - self._buffered + 1), timeout=0)
            if not batch:
                break
            for msg in batch:
                self._take_in(msg)
            got += len(batch)
        return got

    def _probe_assignment(self, consumer: Consumer) -> None:
        """After an assignment, note where each partition ends, so the first
        reserve waits for records that are there rather than returning empty."""
        self._probe = False
        tps = [TopicPartition(t, p) for t, p in self._parts]
        if not tps:
            return
        try:
            committed = consumer.committed(tps, timeout=10)
            for tp in committed:
                low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10,
                                                           cached=False)
                start = tp.offset if tp.offset >= 0 else low
                if high > start:
                    self._expect.note((tp.topic, tp.partition), high - 1)
        except KafkaException as exc:
            log.warning("kafka: could not read offsets after an assignment: %s", exc)

    def _unmet(self) -> bool:
        """True while a record known to exist is not read yet, on a queue with
        nothing ready to hand out (one with records ready need not wait)."""
        for tp, offset in list(self._expect.offsets.items()):
            part = self._parts.get(tp)
            if part is None or part.read_to > offset:
                if part is not None:
                    del self._expect.offsets[tp]
                continue
            if not self._ready.get(self._queue_of(tp[0])[0]):
                return True
        return False

    def _fill(self, consumer: Consumer) -> None:
        """Read what is there; wait (bounded) for records known to exist."""
        if self._probe:
            self._probe_assignment(consumer)
        self._pull(consumer, 0)
        deadline = _clock.monotonic() + self.read_wait
        while self._buffered < self.buffer and self._unmet():
            left = deadline - _clock.monotonic()
            if left <= 0:
                break
            self._pull(consumer, min(0.05, left))

    # -- handing out ----------------------------------------------------------------------------
    def _promote(self, queue: str, now: float) -> None:
        parked = self._parked.get(queue)
        while parked and parked[0][0] <= now:
            _, record = heapq.heappop(parked)
            if self._live(record) and record.state == _PARKED:
                record.state = _READY
                self._ready.setdefault(queue, collections.deque()).append(record)

    def _acquire(self, records: Sequence[_Record]) -> list[bool]:
        """Take the leases of ``records``, in one round trip where the lock store allows."""
        return self.locks.acquire_many([(r.key, r.owner) for r in records], self.lease)

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        if limit <= 0:
            return []
        with self._lock:
            consumer = self._consumer_for(queues)
            self._fill(consumer)
            now = _clock.now()
            self._housekeeping(consumer, now)
            taken: list[QueuedJob] = []
            try:
                for queue in queues:
                    self._promote(queue, now)
                    ready = self._ready.get(queue)
                    while ready and len(taken) < limit:
                        batch: list[_Record] = []
                        while ready and len(batch) < limit - len(taken):
                            record = ready.popleft()
                            if self._live(record) and record.state == _READY:
                                record.owner = f"{self._token}:{next(self._seq)}"
                                batch.append(record)
                        if not batch:
                            break
                        try:
                            acquired = self._acquire(batch)
                        except Exception:
                            # Still ready: put back in order, or no one would hand them
                            # out and their partition's commit would stop at them.
                            ready.extendleft(reversed(batch))
                            raise
                        for record, ok in zip(batch, acquired, strict=True):
                            if not ok:
                                self._contended(record, now)
                                continue
                            job = self._hand_out(record, now)
                            if job.attempts > job.max_attempts:
                                self._gave_up(job, record)
                            else:
                                taken.append(job)
                    if len(taken) >= limit:
                        break
            except Exception as exc:
                if not taken:
                    raise
                # Their leases are taken: hand them out rather than strand them.
                log.warning("kafka: reserve stopped part-way; handing out the %d job(s) taken: %s", len(taken), exc)
            self._commit(consumer)
            return taken

    def _hand_out(self, record: _Record, now: float) -> QueuedJob:
        record.state = _RUNNING
        record.handouts += 1
        record.lease_until = now + self.lease
        job = record.job
        return replace(job, attempts=job.attempts + record.handouts + record.lapsed, connection=self.connection,
                       receipt=_Receipt(record, record.handouts))

    def _gave_up(self, job: QueuedJob, record: _Record) -> None:
        """A job whose workers died under it until its attempts ran out: dead-letter
        it rather than let it take down worker after worker."""
        error = JobCrashedError(
            f"job {job.name!r} ({job.id}): the worker running it stopped without finishing "
            f"{record.lapsed} time(s); {job.max_attempts} attempt(s) used up"
        )
        info = ExceptionInfo.from_exception(error)
        log.error("kafka: %s", info.message)
        try:
            self.fail(job, info)
        except Exception as exc:  # noqa: BLE001 - its lease lapses and reclaim_expired brings it back
            log.warning("kafka: could not dead-letter job %s (tried again when its lease lapses): %s", job.id, exc)
            return
        signals.emit(signals.job_failed, self, job=job, connection=self.connection, error=info.error, exception=info)
        if job.unique_key is not None and job.unique_owner is not None and self._unique_locks is not None:
            try:
                self._unique_locks.release(job.unique_key, job.unique_owner)
            except Exception as exc:  # noqa: BLE001 - the unique lock's own expiry is the net
                log.warning("kafka: could not release unique lock %s: %s", job.unique_key, exc)

    def _contended(self, record: _Record, now: float) -> None:
        """Someone holds this job's lease: a live worker runs it (or ran it and is
        finishing); watch it until it is marked done or the lease lapses."""
        record.state = _WATCHED
        record.next_check = now
        self._watched.append(record)
        self._check_watched(now)

    def _check_watched(self, now: float) -> None:
        still: list[_Record] = []
        for record in self._watched:
            if not self._live(record) or record.state != _WATCHED:
                continue
            if record.next_check > now:
                still.append(record)
                continue
            try:
                holder = self.locks.owner(record.key)
                done = self.locks.owner(self._done_key(record)) is not None
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("kafka: lock store unavailable while watching job %s: %s", record.job.id, exc)
                record.next_check = now + 1.0
                still.append(record)
                continue
            if done:
                record.state = _DONE
            elif holder is None:
                # The worker that held it stopped renewing: it died (or gave the
                # job up when stopping), which used up an attempt.
                record.lapsed += 1
                record.state = _READY
                self._ready.setdefault(record.queue, collections.deque()).appendleft(record)
            else:
                record.next_check = now + min(1.0, self.lease / 4)
                still.append(record)
        self._watched = still

    def _housekeeping(self, consumer: Consumer, now: float) -> None:
        if self._watched:
            self._check_watched(now)
        cycle: list[_Record] = []
        for parked in self._parked.values():
            for _, record in parked:
                if record.state == _PARKED and record.parked_since + self.park_horizon <= now and self._live(record):
                    cycle.append(record)
        if cycle:
            acked: set[int] = set()
            try:
                self._produce([(r.part.tp[0], r.job.id, r.job.encode().encode()) for r in cycle], acked)
            finally:
                # Only the copies on the broker replace their records: one re-produced
                # again next time would be a second copy, run twice.
                for index in acked:
                    cycle[index].state = _DONE
                if acked:
                    self._forget_stale()

    # -- settling ---------------------------------------------------------------------------------
    def _holding(self, job: QueuedJob) -> _Record | None:
        receipt = job.receipt
        if not isinstance(receipt, _Receipt):
            return None
        record = receipt.record
        if record.handouts != receipt.handout:
            return None  # reclaimed and handed out again: no longer this holder's
        if record.state == _READY and self._live(record):
            # Reclaimed after its lease lapsed but not handed out again: its worker
            # was alive after all, and what it reports (or its heartbeat) still counts.
            record.state = _RUNNING
        return record if record.state == _RUNNING else None

    def _superseded(self, record: _Record) -> bool:
        """True when the job's partition moved away and its lease lapsed: the
        partition's new owner runs it (or will), so this holder must not write
        a copy of it (a retry or a dead letter) beside that run."""
        if self._live(record):
            return False
        try:
            return self.locks.owner(record.key) != record.owner
        except Exception as exc:  # noqa: BLE001 - cannot tell: settle as asked
            log.warning("kafka: lock store unavailable while settling job %s: %s", record.job.id, exc)
            return False

    def _finish(self, record: _Record) -> None:
        record.state = _DONE
        if not self._live(record):
            # Its partition moved while it ran: the new owner is watching its lease.
            self._mark_done(record)

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        with self._lock:
            for job in jobs:
                record = self._holding(job)
                if record is not None:
                    self._finish(record)
            if self._consumer is not None:
                self._commit(self._consumer)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs are produced again at once, their attempt uncounted."""
        for job in jobs:
            self.release(replace(job, attempts=max(0, job.attempts - 1)), 0)

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        with self._lock:
            record = self._holding(job)
            if record is None:
                return
            if self._superseded(record):
                record.state = _DONE
                log.warning("kafka: job %s lost its lease before its release; its partition's owner runs it", job.id)
                return
            delay = max(0.0, float(delay))
            again = replace(record.job, attempts=job.attempts, available_at=_clock.now() + delay, receipt=None)
            topic = self.topic(job.queue) + (_DELAYED if delay > 0 else "")
            self._produce([(topic, job.id, again.encode().encode())])
            self._finish(record)
            if self._consumer is not None:
                self._commit(self._consumer)

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        info = as_exception_info(error)
        with self._lock:
            failed = FailedJob.of(replace(job, receipt=None), info, _clock.now())
            body = {
                "id": failed.id, "name": failed.name, "queue": failed.queue, "payload": failed.payload,
                "error": failed.error, "exception": info.to_dict(), "failed_at": failed.failed_at,
                "attempts": failed.attempts, "max_attempts": failed.max_attempts,
                "job": replace(job, receipt=None).to_wire(),
            }
            record = self._holding(job)
            if isinstance(job.receipt, _Receipt) and (record is None or self._superseded(record)):
                # Reclaimed and handed out again, or run by its partition's new
                # owner: that attempt decides; a dead letter here would be a second copy.
                if record is not None:
                    record.state = _DONE
                log.warning("kafka: job %s lost its lease before it failed; not dead-lettered", job.id)
                return failed
            self._produce([(self.topic(job.queue) + _FAILED, job.id, encode({"failed": body}).encode())])
            if record is not None:
                self._finish(record)
                if self._consumer is not None:
                    self._commit(self._consumer)
            return failed

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        ttl = self.lease if seconds is None else float(seconds)
        with self._lock:
            now = _clock.now()
            held = [r for r in (self._holding(job) for job in as_job_list(jobs)) if r is not None]
            renewed = self.locks.renew_many([(r.key, r.owner) for r in held], ttl) if held else []
            lapsed = [r for r, ok in zip(held, renewed, strict=True) if not ok]
            for record, ok in zip(held, renewed, strict=True):
                if ok:
                    record.lease_until = now + ttl
            if lapsed:
                # A late heartbeat from a live worker: take the lease back unless
                # someone else took it, rather than let the job run a second time.
                retaken = self.locks.acquire_many([(r.key, r.owner) for r in lapsed], ttl)
                for record, ok in zip(lapsed, retaken, strict=True):
                    if ok:
                        record.state = _RUNNING
                        record.lease_until = now + ttl
                        log.warning("kafka: job %s's lease had lapsed under its live worker; taken back",
                                    record.job.id)
                    else:
                        log.warning("kafka: job %s lost its lease (it lapsed); another worker may run it",
                                    record.job.id)
            if self._consumer is not None:
                self._pull(self._consumer, 0)  # keeps max.poll.interval.ms satisfied while jobs run
                self._commit(self._consumer)

    def reclaim_expired(self) -> int:
        """Hand out again jobs this consumer holds whose lease lapsed (their
        worker stopped renewing it). Other consumers' jobs come back through
        the group: a dead consumer's partitions are reassigned."""
        reclaimed = 0
        with self._lock:
            now = _clock.now()
            for part in self._parts.values():
                for record in part.records:
                    if record.state != _RUNNING or record.lease_until > now:
                        continue
                    if self.locks.owner(record.key) == record.owner:
                        continue
                    record.state = _READY
                    self._ready.setdefault(record.queue, collections.deque()).appendleft(record)
                    reclaimed += 1
        return reclaimed

    def _commit(self, consumer: Consumer, *, force: bool = False) -> None:
        now = _clock.monotonic()
        if not force and now - self._last_commit < self.commit_interval:
            return
        self._last_commit = now
        offsets = []
        for part in self._parts.values():
            point = part.commit_point()
            if point > part.committed:
                offsets.append((part, point))
        if not offsets:
            return
        commits = [TopicPartition(p.tp[0], p.tp[1], o) for p, o in offsets]
        try:
            if force:
                consumer.commit(offsets=commits, asynchronous=False)
            else:
                consumer.commit(offsets=commits, asynchronous=True)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            log.warning("kafka: commit failed (retried with the next one): %s", exc)
            return
        for part, point in offsets:
            part.committed = point

    # -- waiting --------------------------------------------------------------------------------------
    def _has_work(self, queues: Sequence[str], now: float) -> bool:
        for queue in queues:
            if self._ready.get(queue):
                return True
            parked = self._parked.get(queue)
            if parked and parked[0][0] <= now:
                return True
        return any(r.next_check <= now for r in self._watched)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        deadline = _clock.monotonic() + timeout
        while not waker.is_set() and not self._closed:
            with self._lock:
                consumer = self._consumer_for(queues)
                now = _clock.now()
                if self._has_work(queues, now):
                    return
                left = deadline - _clock.monotonic()
                if left <= 0:
                    return
                self._commit(consumer)
                got = self._pull(consumer, min(0.05, left))
                idle = self._buffered >= self.buffer and not got
            if idle:
                waker.wait(min(0.05, left))

    # -- the failed store -------------------------------------------------------------------------------
    def _inspect(self) -> Consumer:
        if self._inspector is None:
            config = {k: v for k, v in self._consumer_config.items()}
            config["enable.auto.commit"] = False
            self._inspector = Consumer(config)
        return self._inspector

    def _read_topics(self, topics: Sequence[str]) -> list[Message]:
        """Every record of ``topics``, in log order per partition (no group join, no commit)."""
        if not topics:
            return []
        with self._inspect_lock:
            consumer = self._inspect()
            metadata = self._admin.list_topics(timeout=10)
            want: dict[TP, int] = {}
            assignment = []
            for topic in topics:
                meta = metadata.topics.get(topic)
                if meta is None:
                    continue
                for partition in meta.partitions:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10,
                                                               cached=False)
                    if high > low:
                        want[(topic, partition)] = high - 1
                        assignment.append(TopicPartition(topic, partition, low))
            if not assignment:
                return []
            consumer.assign(assignment)
            out: list[Message] = []
            try:
                deadline = _clock.monotonic() + 10
                while want and _clock.monotonic() < deadline:
                    first = consumer.poll(0.1)
                    if first is None:
                        continue
                    for m in [first, *consumer.consume(1000, timeout=0)]:
                        if m.error() is not None:
                            continue
                        out.append(m)
                        tp = (m.topic() or "", m.partition() or 0)
                        offset = m.offset()
                        if tp in want and offset is not None and offset >= want[tp]:
                            del want[tp]
                # tansu's high watermark can stop short of a batch's last records: take what arrived with it
                out.extend(m for m in consumer.consume(1000, timeout=0) if m.error() is None)
            finally:
                consumer.unassign()
            return out

    def _failed_topics(self) -> list[str]:
        return [t for t in self._list_topics() if t.endswith(_FAILED)]

    def _failed_state(self) -> dict[str, tuple[FailedJob, dict[str, Any], str]]:
        """id -> (failed job, its stored body, its topic), tombstones applied."""
        state: dict[str, tuple[FailedJob, dict[str, Any], str]] = {}
        for msg in self._read_topics(self._failed_topics()):
            key = (msg.key() or b"").decode("utf-8", "replace")
            value = msg.value()
            topic = msg.topic() or ""
            if value is None:
                state.pop(key, None)
                continue
            try:
                body = decode(value)["failed"]
                info = ExceptionInfo.from_dict(body.get("exception"))
                failed = FailedJob(
                    id=str(body["id"]), name=str(body.get("name", "")), queue=str(body.get("queue", "")),
                    connection=self.connection, payload=dict(body.get("payload") or {}),
                    error=str(body.get("error", info.error)), exception=info,
                    failed_at=float(body.get("failed_at", 0.0)), attempts=int(body.get("attempts", 0)),
                    max_attempts=int(body.get("max_attempts", 1)),
                )
                if isinstance(body.get("job"), dict):
                    failed.job = QueuedJob.from_wire(body["job"], connection=self.connection)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("kafka: unreadable dead letter in %s: %s", topic, exc)
                continue
            state.pop(failed.id, None)
            state[failed.id] = (failed, body, topic)
        return state

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        entries = [f for f, _, _ in self._failed_state().values()]
        entries.sort(key=lambda f: f.failed_at, reverse=True)
        return entries[:limit]

    def failed_count(self) -> int:
        return len(self._failed_state())

    def retry_failed(self, id: str) -> bool:
        entry = self._failed_state().get(id)
        if entry is None:
            return False
        failed, body, topic = entry
        now = _clock.now()
        if failed.job is not None:
            job = replace(failed.job, attempts=0, available_at=now, receipt=None)
            self._produce([self._job_record(job, now)])
        elif body.get("raw") is not None and body.get("source"):
            self._produce([(str(body["source"][0]), id, str(body["raw"]).encode())])
        self._produce([(topic, id, None)])
        return True

    def forget_failed(self, id: str) -> bool:
        entry = self._failed_state().get(id)
        if entry is None:
            return False
        self._produce([(entry[2], id, None)])
        return True

    # -- inspection ---------------------------------------------------------------------------------------
    def _lag(self, topics: Sequence[str]) -> int:
        with self._lock:
            if self._consumer is not None:
                self._commit(self._consumer, force=True)
        metadata = self._admin.list_topics(timeout=10)
        tps = [TopicPartition(t, p) for t in topics if t in metadata.topics for p in metadata.topics[t].partitions]
        if not tps:
            return 0
        with self._inspect_lock:
            consumer = self._inspect()
            total = 0
            for tp in consumer.committed(tps, timeout=10):
                low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10,
                                                           cached=False)
                start = tp.offset if tp.offset >= 0 else low
                total += max(0, high - start)
            return total

    def size(self, queue: str | None = None) -> int:
        """Records not yet committed by the group (due, delayed and running).

        From end offsets minus committed offsets: right on Kafka; on tansu only
        when producers send one record per batch (its high watermark is wrong
        after a multi-record batch)."""
        if queue is None:
            return sum(self.size(q) for q in self.queue_names())
        main = self.topic(queue)
        return self._lag([main, main + _DELAYED])

    def counts(self, queue: str) -> QueueCounts:
        main = self.topic(queue)
        return QueueCounts(ready=self._lag([main]), delayed=self._lag([main + _DELAYED]))

    def queue_names(self) -> list[str]:
        names = {self._queue_of(t)[0] for t in self._list_topics()}
        return sorted(n for n in names if n)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                try:
                    self._commit(consumer, force=True)
                    # Jobs still running here were abandoned: free their leases for the next owner.
                    running = [r for part in self._parts.values() for r in part.records if r.state == _RUNNING]
                    for record in running:
                        self.locks.release(record.key, record.owner)
                except Exception as exc:  # noqa: BLE001 - closing must not raise; their leases lapse
                    log.warning("kafka: closing the consumer: %s", exc)
                try:
                    # Always: leave the group (revoking, so what is done is committed
                    # and marked) rather than hold its partitions until it is dropped.
                    consumer.close()
                except Exception as exc:  # noqa: BLE001 - closing must not raise
                    log.warning("kafka: closing the consumer: %s", exc)
            self._producer.flush(10)
        with self._inspect_lock:
            if self._inspector is not None:
                self._inspector.close()
                self._inspector = None

