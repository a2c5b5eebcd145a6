"""The group consumer: subscribing, rebalances, and reading records into
the buffers a session hands jobs out from."""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import uuid
from typing import Any, Callable, Sequence

from ... import _clock
from ...state.base import LockStore
from ...types import ExceptionInfo, QueuedJob, encode
from .client import _DELAYED, _FAILED, Consumer, KafkaClient, KafkaError, KafkaException, Message, TopicPartition
from .partitions import PartitionBook
from .records import _PARKED, _READY, _Expect, _Partition, _Record, dead_letter, read_job, stuck_record

log = logging.getLogger("rainier_sync.kafka")


class KafkaConsumer(PartitionBook):
    """One group consumer and what it has read: records ready to hand out,
    delayed ones parked until due, and contended ones watched."""

    def __init__(
        self,
        client: KafkaClient,
        locks: LockStore,
        *,
        group: str,
        topic_prefix: str,
        lease: float,
        park_horizon: float,
        buffer: int,
        commit_interval: float,
        timeout: float,
        announce: Callable[[ExceptionInfo, str | None], None],
    ) -> None:
        super().__init__(locks, keys=f"kafka:{group}:{topic_prefix}", lease=lease, commit_interval=commit_interval)
        self._client = client
        self._announce = announce
        self.group = group
        self.topic_prefix = topic_prefix
        self.lease = lease
        self.park_horizon = park_horizon
        self.buffer = buffer
        self.timeout = timeout
        #: Longest wait for the group to hand this consumer its partitions.
        self.join_timeout = timeout
        self.commit_wait = timeout
        #: Longest wait, in ``reserve``, for records known to be on the broker.
        self.read_wait = 3.0
        self._token = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self._lock = threading.RLock()
        self._consumer_config: dict[str, Any] = {**client.consumer_config, "on_commit": self._on_commit}
        self._consumer: Consumer | None = None
        self._queues: set[str] = set()
        self._assigned = threading.Event()
        self._unassigned_since: float | None = None  # subscribed, or every partition taken away, and none assigned
        self._ready: dict[str, collections.deque[_Record]] = {}
        self._parked: dict[str, list[tuple[float, _Record]]] = {}
        self._watched: list[_Record] = []
        self._probe = False
        self._expect = _Expect()
        self._down_since: float | None = None  # the consumer reported every broker down
        self._closed = False

    @property
    def _buffered(self) -> int:
        """Records read and waiting to be handed out (parked delayed records not counted)."""
        return sum(len(ready) for ready in self._ready.values())

    def _lease_key(self, job: QueuedJob) -> str:
        return f"{self._keys}:lease:{job.id}:{job.attempts}:{int(job.available_at * 1000)}"

    def produce(self, records: Sequence[tuple[str, str, bytes | None]], acked: set[int] | None = None) -> None:
        """Write ``(topic, key, value)`` records (see :meth:`KafkaClient.produce`);
        where they land, this consumer expects to read them."""
        self._client.produce(records, acked, self._expect.note)

    def _consumer_for(self, queues: Sequence[str]) -> Consumer:
        """The group consumer, subscribed to every queue asked for so far."""
        wanted = set(queues) - self._queues
        if wanted or self._consumer is None:
            for queue in wanted:
                self._client.topic(queue)
            self._queues |= wanted
            topic = self._client.topic
            topics = tuple(sorted(t for q in self._queues for t in (topic(q), topic(q) + _DELAYED)))
            self._client.ensure_topics(topics)
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
                raise self._client.unavailable(
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
            raise self._client.unavailable(f"every broker has been down for {self.timeout:g}s or more", exc) from exc
        self._down_since = None

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._parts[(tp.topic, tp.partition)] = _Partition((tp.topic, tp.partition))
        self._probe = True
        self._down_since = None
        self._unassigned_since = None
        self._assigned.set()

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
            # Sent before the consumer rejoins, on the same connection to the
            # coordinator; not waited for (a callback cannot serve the answer, and
            # librdkafka's synchronous commit waits without end for a coordinator
            # that does not answer). One that does not land has the next owner
            # re-read finished records, which their done markers pass.
            try:
                consumer.commit(offsets=offsets, asynchronous=True)
                self._commits_sent += 1
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
            job = read_job(value, self._client.connection)
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

    def _serve(self, consumer: Consumer, wait: float) -> None:
        self._take_in(consumer.poll(wait))

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
            log.warning("kafka: consumer error on connection %r (retrying): %s", self._client.connection, err)

    def _discard(self, topic: str, partition: int, offset: int, queue: str, value: bytes | None,
                 exc: Exception) -> bool:
        """A record that cannot be read as a job: announce it, dead-letter it, move on.
        False when the dead-letter topic refused it."""

        def store(failed: dict[str, Any]) -> None:
            dead = self._client.topic(queue) + _FAILED
            self.produce([(dead, str(failed["id"]), encode({"failed": failed}).encode())])

        return dead_letter((topic, partition, offset), queue, value, exc, announce=self._announce,
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
        reserve waits for records that are there rather than returning empty,
        and which records may have run under an earlier owner: those below the
        end offset (in a group that committed there) or below the reach stored
        in the lock store, whichever is further."""
        self._probe = False
        tps = [TopicPartition(t, p) for t, p in self._parts]
        if not tps:
            return
        try:
            self._probe_offsets(consumer, tps)
        finally:
            for part in self._parts.values():
                self._learn_reach(part)

    def _probe_offsets(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
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
                    # A broker that lost its commits, or reports a wrong end offset (tansu,
                    # after a multi-record batch), says too little: the stored reach covers that.
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

    def _promote(self, queue: str, now: float) -> None:
        parked = self._parked.get(queue)
        while parked and parked[0][0] <= now:
            _, record = heapq.heappop(parked)
            if self._live(record) and record.state == _PARKED:
                record.state = _READY
                self._ready.setdefault(queue, collections.deque()).append(record)
