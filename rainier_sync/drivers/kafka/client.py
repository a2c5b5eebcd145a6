"""The Kafka client: broker and topic names, the confluent_kafka clients, and
which broker errors mean *unreachable* (:class:`KafkaUnavailableError`).

The one module of the driver that imports confluent_kafka: the others take
its names from here, so a missing extra is refused by name.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from ...errors import ConfigurationError, DriverUnavailableError, KafkaQueueError, KafkaUnavailableError, PayloadError
from ...types import QueuedJob

try:
    from confluent_kafka import Consumer as Consumer
    from confluent_kafka import KafkaError as KafkaError
    from confluent_kafka import KafkaException as KafkaException
    from confluent_kafka import Message as Message
    from confluent_kafka import Producer as Producer
    from confluent_kafka import TopicPartition as TopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError(
        "the Kafka driver needs confluent-kafka: pip install 'rainier_sync[kafka]'"
    ) from error

log = logging.getLogger("rainier_sync.kafka")

_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")
_DELAYED, _FAILED = ".delayed", ".failed"

TP = tuple[str, int]

#: What librdkafka adds to a record's key and value when it holds it to ``message.max.bytes``.
_RECORD_OVERHEAD = 36

#: Error codes that mean the broker could not be reached (rather than that it refused).
_UNREACHABLE = {
    KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE, KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR, KafkaError.LEADER_NOT_AVAILABLE,
}


def _code(exc: BaseException) -> Any:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


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


class KafkaClient:
    """One connection's producer and admin client, its topic names, and the
    settings its consumers are built from."""

    def __init__(
        self,
        brokers: str,
        *,
        group: str,
        topic_prefix: str,
        lease: float,
        partitions: int,
        timeout: float,
        topic_config: Mapping[str, str] | None,
        producer_config: Mapping[str, Any] | None,
        consumer_config: Mapping[str, Any] | None,
    ) -> None:
        self.brokers = brokers
        self.topic_prefix = topic_prefix
        self.partitions = partitions
        self.timeout = timeout
        #: The connection name the manager declared the driver under (for messages and jobs).
        self.connection = "default"
        #: Topic settings for the job and delay topics the driver creates.
        self.topic_config = {str(k): str(v) for k, v in (topic_config or {}).items()}
        # Back off at most 2 s between reconnects (librdkafka: 10 s), so workers
        # pick up again soon after a broker restart.
        base: dict[str, Any] = {"bootstrap.servers": brokers, "logger": log, "reconnect.backoff.max.ms": 2000}
        self.producer_config: dict[str, Any] = {
            **base,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            # A record is delivered or failed for good before push returns: no
            # late delivery of a job the caller was told was refused.
            "message.timeout.ms": int(timeout * 1000),
            **dict(producer_config or {}),
        }
        self.flush_timeout = float(self.producer_config["message.timeout.ms"]) / 1000 + 1
        #: The largest record the producer takes (librdkafka's ``message.max.bytes``).
        self.max_record = int(self.producer_config.get("message.max.bytes", 1_000_000))
        #: The group consumers' settings (a consumer adds its own ``on_commit``).
        self.consumer_config: dict[str, Any] = {
            **base,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1500,
            "max.poll.interval.ms": max(300_000, int(lease * 2000)),
            "fetch.wait.max.ms": 50,
            "allow.auto.create.topics": False,
            **dict(consumer_config or {}),
        }
        self.producer = Producer(self.producer_config)
        self.admin = AdminClient(dict(base))
        self._topics: set[str] = set()

    def unavailable(self, what: str, detail: object = "") -> KafkaUnavailableError:
        tail = f": {detail}" if detail else ""
        return KafkaUnavailableError(
            f"kafka connection {self.connection!r} (brokers {self.brokers}): {what}{tail}"
        )

    # -- names -------------------------------------------------------------------------
    def topic(self, queue: str) -> str:
        """The topic of ``queue``'s due jobs."""
        if not queue or not _TOPIC_CHARS.match(queue) or len(self.topic_prefix + queue) > 240:
            raise PayloadError(
                f"queue name {queue!r} cannot be a Kafka topic: use letters, digits, '.', '_' and '-' (240 at most)"
            )
        return self.topic_prefix + queue

    def queue_of(self, topic: str) -> tuple[str, str]:
        """The queue of ``topic`` and which of its topics it is (``""``, ``.delayed``, ``.failed``)."""
        name = topic[len(self.topic_prefix):]
        for suffix in (_DELAYED, _FAILED):
            if name.endswith(suffix):
                return name[: -len(suffix)], suffix
        return name, ""

    # -- topics ------------------------------------------------------------------------
    def ensure_topics(self, names: Iterable[str]) -> None:
        missing = [n for n in names if n not in self._topics]
        if not missing:
            return
        existing = set(self.metadata().topics)
        create = [n for n in missing if n not in existing]
        if create:
            futures = self.admin.create_topics(
                [self._new_topic(n) for n in create],
                operation_timeout=self.timeout,
                request_timeout=self.timeout,
            )
            for name, future in futures.items():
                try:
                    future.result()
                except KafkaException as exc:
                    if _code(exc) == KafkaError.TOPIC_ALREADY_EXISTS:
                        continue
                    if _code(exc) in _UNREACHABLE:
                        raise self.unavailable(f"could not create topic {name!r}", exc) from exc
                    raise KafkaQueueError(f"kafka: could not create topic {name!r}: {exc}") from exc
        self._topics.update(missing)

    def metadata(self) -> Any:
        """The cluster's metadata, or KafkaUnavailableError after ``timeout``."""
        try:
            return self.admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise self.unavailable(f"no answer within {self.timeout:g}s", exc) from exc

    def _new_topic(self, name: str) -> NewTopic:
        if name.endswith(_FAILED):
            # One partition keeps the ledger in one order; compaction keeps the
            # latest entry per job id and lets a broker drop forgotten ones.
            return NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})
        return NewTopic(name, self.partitions, 1, config=dict(self.topic_config))

    def list_topics(self) -> list[str]:
        return [t for t in self.metadata().topics if t.startswith(self.topic_prefix)]

    # -- producing -----------------------------------------------------------------------
    def produce(
        self,
        records: Sequence[tuple[str, str, bytes | None]],
        acked: set[int] | None = None,
        on_offset: Callable[[TP, int], None] | None = None,
    ) -> None:
        """Write ``(topic, key, value)`` records; returns once every one is
        acknowledged by the broker (acks=all), else raises naming how many failed.
        ``acked`` collects the indexes of the records the broker acknowledged;
        ``on_offset`` is told where each one landed."""
        self.ensure_topics({t for t, _, _ in records})
        failures: list[str] = []
        unreachable = [0]
        pending = [len(records)]

        def delivered(index: int, err: Any, msg: Message) -> None:
            pending[0] -= 1
            if err is not None:
                failures.append(f"{msg.topic()} key={msg.key()!r}: {err}")
                if isinstance(err, KafkaError) and err.code() in _UNREACHABLE:
                    unreachable[0] += 1
            else:
                if acked is not None:
                    acked.add(index)
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if on_offset is not None and topic is not None and partition is not None and offset is not None:
                    on_offset((topic, partition), offset)

        producer = self.producer
        for index, (topic, key, value) in enumerate(records):
            while True:
                try:
                    producer.produce(topic, value=value, key=key.encode(),
                                     on_delivery=functools.partial(delivered, index))
                    break
                except BufferError:
                    producer.poll(0.05)
                except Exception:
                    # The records before it are on their way: wait for them, so ``acked`` says which went through.
                    producer.flush(self.flush_timeout)
                    raise
        left = producer.flush(self.flush_timeout)
        if left or pending[0] > 0:
            raise self.unavailable(
                f"{pending[0]} record(s) not acknowledged by the broker within {self.flush_timeout:g}s"
            )
        if failures and unreachable[0] == len(failures):
            raise self.unavailable(f"{len(failures)} record(s) not delivered", failures[0])
        if failures:
            raise KafkaQueueError(f"kafka: {len(failures)} record(s) refused: {failures[0]}")

    def job_record(self, job: QueuedJob, now: float) -> tuple[str, str, bytes]:
        """The ``(topic, key, value)`` record of ``job``: its delay topic when not yet due;
        :class:`PayloadError` for a queue name no topic can have, or a record over
        the producer's ``message.max.bytes``."""
        topic = self.topic(job.queue)
        if job.available_at > now:
            topic += _DELAYED
        value = job.encode().encode()
        size = len(value) + len(job.id) + _RECORD_OVERHEAD
        if size > self.max_record:
            raise PayloadError(
                f"job {job.name!r} ({job.id}) is {len(value)} bytes as JSON; kafka connection {self.connection!r} "
                f"takes records of at most {self.max_record} bytes (message.max.bytes, {_RECORD_OVERHEAD} of them "
                "the record's own): pass a reference (a key, an id) instead of the data"
            )
        return topic, job.id, value
