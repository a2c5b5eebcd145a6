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

The parts, none of which imports this module: ``client`` (names, the
confluent_kafka clients, unreachable-broker errors), ``records`` (records,
receipts, unreadable records), ``partitions`` (per-partition bookkeeping,
commits, done markers), ``consumer`` (the group consumer and its buffers),
``session`` (handing out and settling) and ``failed`` (the failed store and
out-of-group reads). :class:`KafkaQueue` composes them.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from ... import _clock
from ...errors import ConfigurationError, KafkaQueueError, KafkaUnavailableError
from ...state.base import LockStore
from ...types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob
from ..base import BaseQueue, QueueDriver, Waker
from ..extensions import LendsLocks
from ..pushed import tell_pushed
from .client import (
    _DELAYED,
    _TOPIC_CHARS,
    Consumer,
    KafkaClient,
    Message,
    _brokers,
)
from .failed import KafkaFailedStore, TopicReader
from .session import KafkaSession
from .spec import PROMISES

__all__ = ["KafkaQueue", "KafkaQueueError", "KafkaUnavailableError"]


class KafkaQueue(BaseQueue, LendsLocks):
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
    promises = PROMISES
    capabilities = replace(KafkaSession.capabilities, lends_locks=True)

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
        #: Seconds an operation waits for the brokers before it raises KafkaUnavailableError.
        self.timeout = float(timeout)
        self._client = KafkaClient(
            self.brokers,
            group=group,
            topic_prefix=topic_prefix,
            lease=self.lease,
            partitions=partitions,
            timeout=self.timeout,
            topic_config=topic_config,
            producer_config=producer_config,
            consumer_config=consumer_config,
        )
        self._session = KafkaSession(
            self._client,
            locks,
            group=group,
            topic_prefix=topic_prefix,
            lease=self.lease,
            park_horizon=self.park_horizon,
            buffer=buffer,
            commit_interval=float(commit_interval),
            timeout=self.timeout,
            announce=self.announce_discarded,
        )
        self._reader = TopicReader(self._client)
        self._failed = KafkaFailedStore(self._client, self._reader, self._produce)

    def lock_store(self) -> LockStore:
        """The store this driver keeps its leases in."""
        return self.locks

    def describe(self) -> str:
        return f"kafka {self.brokers} group={self.group} prefix={self.topic_prefix}"

    @property
    def connection(self) -> str:
        return self._client.connection

    @connection.setter
    def connection(self, name: str) -> None:
        self._client.connection = name

    @property
    def commit_interval(self) -> float:
        """Least seconds between two asynchronous commits (one is outstanding at a time)."""
        return self._session.commit_interval

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

    # -- names -------------------------------------------------------------------------
    def topic(self, queue: str) -> str:
        """The topic of ``queue``'s due jobs."""
        return self._client.topic(queue)

    # -- topics ------------------------------------------------------------------------
    def _ensure_topics(self, names: Iterable[str]) -> None:
        self._client.ensure_topics(names)

    def _produce(self, records: Sequence[tuple[str, str, bytes | None]], acked: set[int] | None = None) -> None:
        """Write ``(topic, key, value)`` records (see :meth:`KafkaClient.produce`);
        where they land, this consumer expects to read them."""
        self._session.produce(records, acked)

    def _job_record(self, job: QueuedJob, now: float) -> tuple[str, str, bytes]:
        return self._client.job_record(job, now)

    def push(self, job: QueuedJob) -> str:
        self.push_many([job])
        return job.id

    def check(self, job: QueuedJob) -> None:
        """A queue name no topic can have, a record over the producer's
        ``message.max.bytes`` (:class:`~rainier_sync.errors.PayloadError`)."""
        self._job_record(job, _clock.now())

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Every record checked, then produced; one that fails leaves those the
        broker acknowledged on the error (:func:`~rainier_sync.drivers.pushed.pushed_before`)."""
        if not jobs:
            return []
        now = _clock.now()
        records = [self._job_record(job, now) for job in jobs]
        acked: set[int] = set()
        try:
            self._produce(records, acked)
        except Exception as exc:
            tell_pushed(exc, [jobs[index].id for index in sorted(acked)])
            raise
        return [job.id for job in jobs]

    # -- the consumer operations, on the driver's one session --------------------------------
    # (Each owning loop's SharedSession calls these, so a subclass of the driver sees every call.)
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self._session.reserve_many(queues, limit)

    def acknowledge(self, job: QueuedJob) -> None:
        self._session.acknowledge(job)

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        self._session.acknowledge_many(jobs)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs are produced again at once (one batch), their attempt uncounted."""
        self._session.give_back(jobs)

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self._session.release(job, delay)

    def defer(self, job: QueuedJob, delay: float) -> None:
        self._session.defer(job, delay)

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        return self._session.fail(job, error)

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        self._session.extend(jobs, seconds)

    def reclaim_expired(self) -> int:
        return self._session.reclaim_expired()

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        self._session.wait_for_jobs(queues, timeout, waker)

    # The session's consumer and its state, as tests and tools reach them through the driver.
    @property
    def _consumer(self) -> Any:
        return self._session._consumer

    @_consumer.setter
    def _consumer(self, consumer: Any) -> None:
        self._session._consumer = consumer

    @property
    def _consumer_config(self) -> dict[str, Any]:
        return self._session._consumer_config

    @property
    def _let_go(self) -> Any:
        return self._session._let_go

    @_let_go.setter
    def _let_go(self, let_go: Any) -> None:
        setattr(self._session, "_let_go", let_go)  # noqa: B010 - replaces a method on the instance

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
        self._session.commit_now()
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
        if not self._session.shut_down():
            return
        self._client.producer.flush(10)
        self._reader.close()
