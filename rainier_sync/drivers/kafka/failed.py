"""The failed store (dead letters on ``<queue>.failed`` topics: listing,
retry, forget, counts) and the reader that lists topics and measures lag
outside the consumer group."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Callable, Sequence

from ... import _clock
from ...types import ExceptionInfo, FailedJob, QueuedJob, decode
from .client import _FAILED, TP, Consumer, KafkaClient, KafkaError, KafkaException, Message, TopicPartition

log = logging.getLogger("rainier_sync.kafka")

#: Writes ``(topic, key, value)`` records, returning once the broker acknowledged them.
Produce = Callable[[Sequence[tuple[str, str, bytes | None]]], None]


class TopicReader:
    """A consumer outside the group: reads whole topics and the group's lag."""

    def __init__(self, client: KafkaClient) -> None:
        self._client = client
        self.lock = threading.Lock()
        self._inspector: Consumer | None = None

    def inspector(self) -> Consumer:
        """The reader's consumer, made on first use (hold :attr:`lock` while using it)."""
        if self._inspector is None:
            config = dict(self._client.consumer_config)
            config["enable.auto.commit"] = False
            # A listing reads a whole topic: let the broker gather a full fetch. (A
            # broker slow to read its storage, such as tansu on S3, can answer every
            # 50 ms fetch empty.)
            config["fetch.wait.max.ms"] = max(500, int(config.get("fetch.wait.max.ms", 0)))
            self._inspector = Consumer(config)
        return self._inspector

    def read_topics(self, topics: Sequence[str]) -> list[Message]:
        """Every record of ``topics`` up to the end offsets they had when the read
        began, in log order per partition (no group join, no commit). Raises
        KafkaUnavailableError when those ends are not reached within ``timeout``."""
        if not topics:
            return []
        with self.lock:
            consumer = self.inspector()
            metadata = self._client.metadata()
            ends: dict[TP, int] = {}
            assignment = []
            try:
                for topic in topics:
                    meta = metadata.topics.get(topic)
                    if meta is None:
                        continue
                    for partition in meta.partitions:
                        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                                   timeout=self._client.timeout, cached=False)
                        if high > low:
                            ends[(topic, partition)] = high
                            assignment.append(TopicPartition(topic, partition, low))
            except KafkaException as exc:
                raise self._client.unavailable(f"could not read the end offsets of {', '.join(topics)}", exc) from exc
            if not assignment:
                return []
            consumer.assign(assignment)
            out: list[Message] = []
            reached: dict[TP, int] = {}
            errors: list[str] = []
            try:
                want = dict(ends)
                deadline = _clock.monotonic() + self._client.timeout
                while want:
                    left = deadline - _clock.monotonic()
                    if left <= 0:
                        short = ", ".join(f"{t}[{p}] read to {reached.get((t, p), 0)} of {end}"
                                          for (t, p), end in sorted(want.items()))
                        raise self._client.unavailable(
                            f"reading {', '.join(topics)} did not reach the end offsets seen when it began within "
                            f"{self._client.timeout:g}s ({short})", errors[-1] if errors else "")
                    for m in consumer.consume(1000, timeout=min(0.2, left)):
                        err = m.error()
                        if err is not None:
                            if err.code() != KafkaError._PARTITION_EOF:
                                errors.append(str(err))
                            continue
                        out.append(m)
                        tp = (m.topic() or "", m.partition() or 0)
                        offset = m.offset()
                        if offset is None:
                            continue
                        reached[tp] = offset + 1
                        if tp in want and offset + 1 >= want[tp]:
                            del want[tp]
                # tansu's high watermark can stop short of a batch's last records: take what arrived with it
                out.extend(m for m in consumer.consume(1000, timeout=0) if m.error() is None)
            finally:
                consumer.unassign()
            return out

    # -- lag ---------------------------------------------------------------------------------------
    def lag(self, topics: Sequence[str]) -> int:
        """Records of ``topics`` the group has not committed past."""
        metadata = self._client.metadata()
        tps = [TopicPartition(t, p) for t in topics if t in metadata.topics for p in metadata.topics[t].partitions]
        if not tps:
            return 0
        with self.lock:
            consumer = self.inspector()
            total = 0
            try:
                for tp in consumer.committed(tps, timeout=self._client.timeout):
                    low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                               timeout=self._client.timeout, cached=False)
                    start = tp.offset if tp.offset >= 0 else low
                    total += max(0, high - start)
            except KafkaException as exc:
                raise self._client.unavailable(f"could not read the offsets of {', '.join(topics)}", exc) from exc
            return total

    def close(self) -> None:
        with self.lock:
            if self._inspector is not None:
                self._inspector.close()
                self._inspector = None


class KafkaFailedStore:
    """The dead letters of every queue on one connection, keyed by job id."""

    def __init__(self, client: KafkaClient, reader: TopicReader, produce: Produce) -> None:
        self._client = client
        self._reader = reader
        self._produce = produce

    def _topics(self) -> list[str]:
        return [t for t in self._client.list_topics() if t.endswith(_FAILED)]

    def state(self) -> dict[str, tuple[FailedJob, dict[str, Any], str]]:
        """id -> (failed job, its stored body, its topic), tombstones applied."""
        state: dict[str, tuple[FailedJob, dict[str, Any], str]] = {}
        for msg in self._reader.read_topics(self._topics()):
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
                    connection=self._client.connection, payload=dict(body.get("payload") or {}),
                    error=str(body.get("error", info.error)), exception=info,
                    failed_at=float(body.get("failed_at", 0.0)), attempts=int(body.get("attempts", 0)),
                    max_attempts=int(body.get("max_attempts", 1)),
                )
                if isinstance(body.get("job"), dict):
                    failed.job = QueuedJob.from_wire(body["job"], connection=self._client.connection)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("kafka: unreadable dead letter in %s: %s", topic, exc)
                continue
            state.pop(failed.id, None)
            state[failed.id] = (failed, body, topic)
        return state

    def failed_job(self, id: str) -> FailedJob | None:
        entry = self.state().get(id)
        return entry[0] if entry is not None else None

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        entries = [f for f, _, _ in self.state().values()]
        entries.sort(key=lambda f: f.failed_at, reverse=True)
        return entries[:limit]

    def failed_count(self) -> int:
        return len(self.state())

    def retry_failed(self, id: str) -> bool:
        entry = self.state().get(id)
        if entry is None:
            return False
        failed, body, topic = entry
        now = _clock.now()
        if failed.job is not None:
            job = replace(failed.job, attempts=0, available_at=now, receipt=None)
            self._produce([self._client.job_record(job, now)])
        elif body.get("raw") is not None and body.get("source"):
            self._produce([(str(body["source"][0]), id, str(body["raw"]).encode())])
        self._produce([(topic, id, None)])
        return True

    def forget_failed(self, id: str) -> bool:
        entry = self.state().get(id)
        if entry is None:
            return False
        self._produce([(entry[2], id, None)])
        return True
