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
  offset below which every record is done. One commit is outstanding at a
  time, carrying the latest such offset of every partition; an offset counts
  as committed only once the broker confirms it, and a refused one is sent
  again.
- A job that finishes (acknowledged, released or failed) leaves a *done*
  marker in the lock store, so a record read again after a crash, a broker
  restart or a rebalance is passed, not run again.
- A record that cannot be read as a job (any error) goes alone to the
  dead-letter topic; the records around it are handed out.
- Delayed records are parked in memory by the consumer that reads them and
  handed out when ``_clock.now()`` says they are due; one parked longer than
  ``park_horizon`` is re-produced at the tail of its delay topic, so a
  delay partition's commit never lags more than that.
- The next owner of a partition checks the done marker of a record whose
  lease it could not take, and of one it took that may have run before
  (below the end offset the partition had when it was assigned).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import uuid
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from ... import _clock
from ...errors import ConfigurationError, KafkaQueueError, KafkaUnavailableError
from ...locks.base import LockStore
from ...types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob, as_exception_info, encode
from ..base import BaseQueue, Capabilities, QueueDriver, Waker, as_job_list
from .client import (
    _DELAYED,
    _FAILED,
    _TOPIC_CHARS,
    TP,
    Consumer,
    KafkaClient,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
    _brokers,
    _code,
)
from .failed import KafkaFailedStore, TopicReader
from .partitions import _Partition
from .records import (
    _DONE,
    _PARKED,
    _READY,
    _RUNNING,
    _WATCHED,
    _Expect,
    _Receipt,
    _Record,
    dead_letter,
    read_job,
    stuck_record,
)

__all__ = ["KafkaQueue", "KafkaQueueError", "KafkaUnavailableError"]

log = logging.getLogger("rainier_sync.kafka")

#: The owner of every *done* marker: any consumer can check a marker by renewing it.
_DONE_OWNER = "done"
#: Seconds after which a commit the broker has not answered no longer holds the next one back.
_COMMIT_STALE = 30.0


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
    (least seconds between commits; 0: the next as soon as the broker
    answered the last), ``timeout`` (seconds an operation waits for the
    brokers before raising :class:`KafkaUnavailableError`), ``topic_config``
    (settings of the job and delay topics it creates, e.g.
    ``{"retention.ms": "-1"}``), ``producer_config`` and ``consumer_config``
    (librdkafka settings merged over the driver's).
    """

    driver = QueueDriver.KAFKA
    capabilities = Capabilities(priority=False, give_back=True, wakes=True)

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
        timeout: float = 30.0,
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
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigurationError(f"kafka: timeout must be a positive number of seconds, got {timeout!r}")
        self.brokers = _brokers(brokers)
        self.group = group
        self.topic_prefix = topic_prefix
        self.lease = float(lease)
        self.reservation: float = float(lease)
        self.locks = locks
        self.partitions = partitions
        self.park_horizon = float(park_horizon)
        self.buffer = buffer
        #: Least seconds between two asynchronous commits. Whatever it is, one
        #: commit is outstanding at a time: the next carries the latest offsets.
        self.commit_interval = float(commit_interval)
        #: Seconds an operation waits for the brokers before it raises KafkaUnavailableError.
        self.timeout = float(timeout)
        #: How long a *done* marker lives. The worker renews the markers of its
        #: finished jobs until their commit is confirmed, so a marker outlives the
        #: job's lease and is there when the partition's next owner reads the record.
        self.done_ttl = max(self.lease, 60.0)
        #: Longest wait for the group to hand this consumer its partitions.
        self.join_timeout = self.timeout
        #: Longest wait, in ``reserve``, for records known to be on the broker.
        self.read_wait = 3.0
        self._token = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self._lock = threading.RLock()
        self._client = KafkaClient(
            self.brokers, group=group, topic_prefix=topic_prefix, lease=self.lease, partitions=partitions,
            timeout=self.timeout, topic_config=topic_config, producer_config=producer_config,
            consumer_config=consumer_config,
        )
        self._consumer_config: dict[str, Any] = {**self._client.consumer_config, "on_commit": self._on_commit}
        self._consumer: Consumer | None = None
        self._reader = TopicReader(self._client)
        self._failed = KafkaFailedStore(self._client, self._reader, self._produce)
        self._queues: set[str] = set()
        self._assigned = threading.Event()
        self._unassigned_since: float | None = None  # subscribed, or every partition taken away, and none assigned
        self._parts: dict[TP, _Partition] = {}
        self._ready: dict[str, collections.deque[_Record]] = {}
        self._parked: dict[str, list[tuple[float, _Record]]] = {}
        self._watched: list[_Record] = []
        self._probe = False
        self._expect = _Expect()
        self._last_commit = 0.0
        self._commit_sent_at: float | None = None  # the outstanding asynchronous commit
        self._next_renewal = 0.0  # of done markers whose commit is held back
        self._down_since: float | None = None  # the consumer reported every broker down
        self._quiet_until: dict[Any, float] = {}
        self._closed = False

    @property
    def _buffered(self) -> int:
        """Records read and waiting to be handed out (parked delayed records not counted)."""
        return sum(len(ready) for ready in self._ready.values())

    def describe(self) -> str:
        return f"kafka {self.brokers} group={self.group} prefix={self.topic_prefix}"

    @property
    def connection(self) -> str:
        return self._client.connection

    @connection.setter
    def connection(self, name: str) -> None:
        self._client.connection = name

    @property
    def topic_config(self) -> dict[str, str]:
        """Topic settings for the job and delay topics the driver creates."""
        return self._client.topic_config

    @property
    def _producer(self) -> Any:
        return self._client.producer

    @_producer.setter
    def _producer(self, producer: Any) -> None:
        self._client.producer = producer

    def _unavailable(self, what: str, detail: object = "") -> KafkaUnavailableError:
        return self._client.unavailable(what, detail)

    # -- names -------------------------------------------------------------------------
    def topic(self, queue: str) -> str:
        """The topic of ``queue``'s due jobs."""
        return self._client.topic(queue)

    def _lease_key(self, job: QueuedJob) -> str:
        return f"kafka:{self.group}:{self.topic_prefix}:lease:{job.id}:{job.attempts}:{int(job.available_at * 1000)}"

    def _done_key(self, record: _Record) -> str:
        return record.key.replace(":lease:", ":done:", 1)

    # -- topics ------------------------------------------------------------------------
    def _ensure_topics(self, names: Iterable[str]) -> None:
        self._client.ensure_topics(names)

    def _produce(self, records: Sequence[tuple[str, str, bytes | None]], acked: set[int] | None = None) -> None:
        """Write ``(topic, key, value)`` records (see :meth:`KafkaClient.produce`);
        where they land, this consumer expects to read them."""
        self._client.produce(records, acked, self._expect.note)

    def _job_record(self, job: QueuedJob, now: float) -> tuple[str, str, bytes]:
        return self._client.job_record(job, now)

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
            self._unassigned_since = _clock.monotonic()
            deadline = self._unassigned_since + self.join_timeout
            while not self._assigned.is_set() and _clock.monotonic() < deadline:
                self._take_in(self._consumer.poll(0.05))
        since = self._unassigned_since
        if since is not None and _clock.monotonic() - since >= self.join_timeout:
            self._take_in(self._consumer.poll(0.05))  # the rebalance callbacks run in poll
            if self._unassigned_since is not None:
                raise self._unavailable(
                    f"the consumer group {self.group!r} has assigned this consumer no partitions for "
                    f"{_clock.monotonic() - since:.0f}s"
                )
        if self._down_since is not None and _clock.monotonic() - self._down_since >= self.timeout:
            self._check_reachable()
        return self._consumer

    def _check_reachable(self) -> None:
        """The consumer said every broker is down, ``timeout`` ago: raise unless metadata comes back now."""
        try:
            self._client.admin.list_topics(timeout=min(self.timeout, 5.0))
        except KafkaException as exc:
            self._down_since = _clock.monotonic() - self.timeout + min(self.timeout, 5.0)
            raise self._unavailable(f"every broker has been down for {self.timeout:g}s or more", exc) from exc
        self._down_since = None

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._parts[(tp.topic, tp.partition)] = _Partition((tp.topic, tp.partition))
        self._probe = True
        self._down_since = None
        self._unassigned_since = None
        self._assigned.set()

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker answered an asynchronous commit (served by poll/consume)."""
        self._commit_sent_at = None
        refused = []
        for tp in partitions:
            failed = err if err is not None else tp.error
            if failed is not None:
                refused.append(f"{tp.topic}[{tp.partition}]@{tp.offset}")
                continue
            part = self._parts.get((tp.topic, tp.partition))
            if part is not None and tp.offset >= 0:
                part.confirm(tp.offset)
        if refused and (err is None or err.code() != KafkaError._NO_OFFSET):
            now = _clock.monotonic()
            if now >= self._quiet_until.get("commit", 0.0):
                self._quiet_until["commit"] = now + 10.0
                log.warning("kafka: commit of %s refused (sent again): %s", ", ".join(refused[:4]),
                            err if err is not None else partitions[0].error)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(consumer, partitions, lost=False)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(consumer, partitions, lost=True)

    def _let_go(self, consumer: Consumer, partitions: list[TopicPartition], *, lost: bool) -> None:
        """Partitions leave this consumer: commit what is done (unless lost). Finished
        jobs carry done markers, so the next owner passes them; jobs still running
        write theirs when they finish (see _finish)."""
        offsets: list[TopicPartition] = []
        unmarked: list[_Record] = []
        for tp in partitions:
            part = self._parts.pop((tp.topic, tp.partition), None)
            self._expect.offsets.pop((tp.topic, tp.partition), None)
            if part is None:
                continue
            point = part.commit_point()
            if point > part.committed:
                offsets.append(TopicPartition(tp.topic, tp.partition, point))
            # Only jobs run here: a parked record re-produced at the tail shares
            # its key with the copy, which must still run.
            unmarked.extend(r for r in part.finished() if not r.marked)
        if offsets and not lost:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("kafka: commit on revoke failed (the next owner re-reads those records): %s", exc)
        if unmarked:
            self._mark(unmarked)  # their markers failed when they finished: try again
        self._forget_stale()
        if not self._parts and self._unassigned_since is None:
            self._unassigned_since = _clock.monotonic()

    def _forget_stale(self) -> None:
        """Drop buffered records of partitions no longer ours (the next owner re-reads them)."""
        for queue, ready in self._ready.items():
            self._ready[queue] = collections.deque(r for r in ready if self._live(r) and r.state == _READY)
        for queue, parked in self._parked.items():
            kept = [(at, r) for at, r in parked if self._live(r) and r.state == _PARKED]
            heapq.heapify(kept)
            self._parked[queue] = kept
        self._watched = [r for r in self._watched if self._live(r)]

    def _mark(self, records: Sequence[_Record]) -> None:
        """Write the *done* markers of finished jobs, in one call: whoever reads
        their records again (after a crash, a broker restart or a rebalance)
        passes them instead of running them again."""
        try:
            self.locks.acquire_many([(self._done_key(r), _DONE_OWNER) for r in records], self.done_ttl)
        except Exception as exc:  # noqa: BLE001 - the commit still covers them; a crash first runs them again
            log.warning("kafka: could not mark %d finished job(s) done in the lock store: %s", len(records), exc)
            return
        now = _clock.now()
        for record in records:
            record.marked = True
            record.marked_at = now

    def _marked(self, records: Sequence[_Record]) -> list[bool]:
        """Which of ``records`` have a done marker (renewing a marker is how to see it in one call)."""
        return self.locks.renew_many([(self._done_key(r), _DONE_OWNER) for r in records], self.done_ttl)

    def _renew_marks(self, now: float) -> None:
        """Renew the done markers of finished jobs whose commit is held back (by an
        older job still running, say), so they outlive any wait for the commit."""
        self._next_renewal = now + self.done_ttl / 3
        stale = [r for part in self._parts.values() for r in part.finished()
                 if r.marked and now - r.marked_at >= self.done_ttl / 3]
        if not stale:
            return
        try:
            renewed = self._marked(stale)
        except Exception as exc:  # noqa: BLE001 - tried again next time
            log.warning("kafka: could not renew the done markers of %d job(s): %s", len(stale), exc)
            return
        for record, ok in zip(stale, renewed, strict=True):
            if ok:
                record.marked_at = now
        lost = [r for r, ok in zip(stale, renewed, strict=True) if not ok]
        if lost:
            self._mark(lost)

    def _live(self, record: _Record) -> bool:
        return self._parts.get(record.part.tp) is record.part

    def _take_in(self, msg: Message | None) -> None:
        """Buffer one record read from the consumer."""
        if msg is None:
            return
        err = msg.error()
        if err is not None:
            self._consumer_error(err)
            return
        self._down_since = None
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            return
        part = self._parts.get((topic, partition))
        if part is None:
            return  # a partition already revoked
        part.read_to = offset + 1
        queue, kind = self._client.queue_of(topic)
        value = msg.value()
        try:
            job = read_job(value, self.connection)
            key = self._lease_key(job)
        except Exception as exc:  # noqa: BLE001 - whatever fails to read, this record alone is set aside
            if not self._discard(topic, partition, offset, queue, value, exc):
                # Not dead-lettered: hold the partition's commit here.
                part.records.append(stuck_record(part, offset, queue))
            return
        record = _Record(part, offset, queue, job, key=key)
        part.records.append(record)
        if kind == _DELAYED and job.available_at > _clock.now():
            record.state = _PARKED
            record.parked_since = _clock.now()
            heapq.heappush(self._parked.setdefault(queue, []), (job.available_at, record))
        else:
            self._ready.setdefault(queue, collections.deque()).append(record)

    def _consumer_error(self, err: KafkaError) -> None:
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            return
        now = _clock.monotonic()
        if code == KafkaError._ALL_BROKERS_DOWN and self._down_since is None:
            self._down_since = now
        if now >= self._quiet_until.get(code, 0.0):
            # librdkafka reconnects by itself; say so once in a while, not on every poll.
            self._quiet_until[code] = now + 30.0
            log.warning("kafka: consumer error on connection %r (retrying): %s", self.connection, err)

    def _discard(self, topic: str, partition: int, offset: int, queue: str, value: bytes | None,
                 exc: Exception) -> bool:
        """A record that cannot be read as a job: announce it, dead-letter it, move on.
        False when the dead-letter topic refused it."""

        def store(failed: dict[str, Any]) -> None:
            self._produce([(self.topic(queue) + _FAILED, str(failed["id"]), encode({"failed": failed}).encode())])

        return dead_letter((topic, partition, offset), queue, value, exc, announce=self.announce_discarded,
                           store=store)

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
            committed = consumer.committed(tps, timeout=self.timeout)
            for tp in committed:
                low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                           timeout=self.timeout, cached=False)
                start = tp.offset if tp.offset >= 0 else low
                part = self._parts.get((tp.topic, tp.partition))
                if part is not None:
                    # Records past the end offset were written after this assignment: no one
                    # else can have run them. Nor, in a group that never committed on this
                    # partition, any record (its first owner commits at its first reserve).
                    part.suspect_to = high if tp.offset >= 0 else -1
                    if tp.offset >= 0:
                        part.committed = max(part.committed, tp.offset)
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
            if not self._ready.get(self._client.queue_of(tp[0])[0]):
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
                        got = [r for r, ok in zip(batch, acquired, strict=True) if ok]
                        for record, ok in zip(batch, acquired, strict=True):
                            if not ok:
                                self._contended(record, now)
                        # A job whose attempts its dead workers used up is handed out
                        # too (attempts > max_attempts): the executor fails it as crashed.
                        taken.extend(self._hand_out(record, now) for record in self._not_done(got))
                    if len(taken) >= limit:
                        break
                if self._watched:
                    self._check_watched(now)
            except Exception as exc:
                if not taken:
                    raise
                # Their leases are taken: hand them out rather than strand them.
                log.warning("kafka: reserve stopped part-way; handing out the %d job(s) taken: %s", len(taken), exc)
            self._commit(consumer)
            return taken

    def _not_done(self, records: list[_Record]) -> list[_Record]:
        """Of records whose leases were just taken, those to hand out: a record that
        may have run under an earlier owner of its partition (its lease lapsed since)
        is passed when its done marker says it finished."""
        suspects = [r for r in records if r.offset < r.part.suspect_to and not r.handouts]
        if not suspects:
            return records
        try:
            marked = self._marked(suspects)
        except Exception as exc:  # noqa: BLE001 - cannot tell: run them (at least once)
            log.warning("kafka: lock store unavailable while checking done markers: %s", exc)
            return records
        done = {id(r) for r, ok in zip(suspects, marked, strict=True) if ok}
        if not done:
            return records
        for record in records:
            if id(record) in done:
                record.state = _DONE
                record.marked = True
        return [r for r in records if id(r) not in done]

    def _hand_out(self, record: _Record, now: float) -> QueuedJob:
        record.state = _RUNNING
        record.handouts += 1
        record.lease_until = now + self.lease
        job = record.job
        return replace(job, attempts=job.attempts + record.handouts + record.lapsed, connection=self.connection,
                       receipt=_Receipt(record, record.handouts))

    def _contended(self, record: _Record, now: float) -> None:
        """Someone holds this job's lease: a live worker runs it (or ran it and is
        finishing, or died running it); watch it until it is marked done or the
        lease lapses."""
        record.state = _WATCHED
        record.next_check = now
        self._watched.append(record)

    def _check_watched(self, now: float) -> None:
        still: list[_Record] = []
        due: list[_Record] = []
        for record in self._watched:
            if not self._live(record) or record.state != _WATCHED:
                continue
            (due if record.next_check <= now else still).append(record)
        if not due:
            self._watched = still
            return
        try:
            marked = self._marked(due)
        except Exception as exc:  # noqa: BLE001 - try again next time
            log.warning("kafka: lock store unavailable while watching %d job(s): %s", len(due), exc)
            for record in due:
                record.next_check = now + 1.0
            self._watched = still + due
            return
        for record, done in zip(due, marked, strict=True):
            if done:
                # Finished by its worker (before a crash, or elsewhere after a rebalance).
                record.state = _DONE
                record.marked = True
                continue
            try:
                holder = self.locks.owner(record.key)
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("kafka: lock store unavailable while watching job %s: %s", record.job.id, exc)
                record.next_check = now + 1.0
                still.append(record)
                continue
            if holder is None:
                # The worker that held it stopped renewing and left no done marker: it
                # died running it (or gave the job up when stopping), which used up an attempt.
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

    def _finish(self, records: Sequence[_Record]) -> None:
        """Jobs done (acknowledged, released or failed): mark them, then let the commit pass them."""
        if not records:
            return
        self._mark(records)
        for record in records:
            record.state = _DONE
        if self._consumer is not None:
            self._commit(self._consumer)

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        with self._lock:
            held = [r for r in (self._holding(job) for job in jobs) if r is not None]
            self._finish(held)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs are produced again at once (one batch), their attempt uncounted."""
        with self._lock:
            now = _clock.now()
            back: list[_Record] = []
            copies: list[tuple[str, str, bytes]] = []
            for job in jobs:
                record = self._holding(job)
                if record is None:
                    continue
                if self._superseded(record):
                    record.state = _DONE
                    continue
                again = replace(record.job, attempts=max(0, job.attempts - 1), available_at=now, receipt=None)
                back.append(record)
                copies.append((self.topic(job.queue), job.id, again.encode().encode()))
            if copies:
                self._produce(copies)
                self._finish(back)

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
            self._finish([record])

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
                self._finish([record])
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
        """Commit, per partition, the offset below which every record is done.

        Asynchronous and coalesced: while a commit awaits the broker's answer
        (``_on_commit``) none is sent, and the next carries the latest offsets;
        a refused one is not confirmed, so it is sent again. ``force`` commits
        synchronously now."""
        if _clock.now() >= self._next_renewal:
            self._renew_marks(_clock.now())
        now = _clock.monotonic()
        if not force:
            sent = self._commit_sent_at
            if sent is not None and now - sent < _COMMIT_STALE:
                return
            if now - self._last_commit < self.commit_interval:
                return
        commits = []
        for part in self._parts.values():
            point = part.commit_point()
            if point > part.committed:
                commits.append(TopicPartition(part.tp[0], part.tp[1], point))
        if not commits:
            return
        self._last_commit = now
        try:
            if not force:
                consumer.commit(offsets=commits, asynchronous=True)
                self._commit_sent_at = now
                return
            for tp in consumer.commit(offsets=commits, asynchronous=False) or []:
                confirmed = self._parts.get((tp.topic, tp.partition))
                if confirmed is not None and tp.error is None and tp.offset >= 0:
                    confirmed.confirm(tp.offset)
        except KafkaException as exc:
            if _code(exc) != KafkaError._NO_OFFSET:
                log.warning("kafka: commit failed (sent again with the next one): %s", exc)

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
        return self._reader.inspector()

    @property
    def _inspect_lock(self) -> threading.Lock:
        return self._reader.lock

    def _read_topics(self, topics: Sequence[str]) -> list[Message]:
        return self._reader.read_topics(topics)

    def failed_job(self, id: str) -> FailedJob | None:
        return self._failed.failed_job(id)

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        return self._failed.failed_jobs(limit)

    def failed_count(self) -> int:
        return self._failed.failed_count()

    def retry_failed(self, id: str) -> bool:
        return self._failed.retry_failed(id)

    def forget_failed(self, id: str) -> bool:
        return self._failed.forget_failed(id)

    # -- inspection ---------------------------------------------------------------------------------------
    def _lag(self, topics: Sequence[str]) -> int:
        with self._lock:
            if self._consumer is not None:
                self._commit(self._consumer, force=True)
        return self._reader.lag(topics)

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
        names = {self._client.queue_of(t)[0] for t in self._client.list_topics()}
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
        self._reader.close()

