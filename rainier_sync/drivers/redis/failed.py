"""The Redis driver's failed store: ``Pfailed`` (records by id) and
``Pfailed:index`` (ids by when they failed); on Redis Cluster a pair per queue
(``P{<queue>}:failed``...), so that failing a job stays one script in one slot,
and listing merges the queues' indexes."""

from __future__ import annotations

from typing import Any

from ... import _clock
from ...errors import PayloadError
from ...types import ExceptionInfo, FailedJob, QueuedJob
from ...types import decode as decode_json
from .core import _RedisCore
from .wire import _line, _num, _record


class _FailedStore(_RedisCore):
    """Listing, counting, retrying and forgetting failed jobs."""

    def _failed_from(self, failed_id: str, raw: bytes | None) -> FailedJob | None:
        if raw is None:
            return None
        try:
            record = decode_json(raw)
            info = ExceptionInfo.from_dict(record.get("exception", record.get("error", "")))
            job = QueuedJob.from_wire(record["job"], connection=self.connection)
            failed = FailedJob.of(job, info, float(record.get("failed_at", 0.0)))
            failed.error = str(record.get("error", info.error))
            return failed
        except Exception as exc:  # noqa: BLE001 - listed as unreadable, never raised: the others must still list
            info = ExceptionInfo.from_message(f"the failed-job record is unreadable: {type(exc).__name__}: {exc}")
            return FailedJob(
                id=failed_id,
                name="<unreadable>",
                queue="?",
                connection=self.connection,
                payload={},
                error=info.error,
                exception=info,
                failed_at=0.0,
            )

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        if limit <= 0:
            return []
        keys = self.keys
        if not self.cluster:

            def read() -> tuple[Any, Any]:
                ids: Any = self._client.zrevrange(keys.failed_index(""), 0, limit - 1)
                return ids, (self._client.hmget(keys.failed(""), ids) if ids else [])

            ids, records = self._call("failed_jobs", read)
            found = [(failed_id.decode(), raw) for failed_id, raw in zip(ids, records, strict=True)]
        else:
            found = self._call("failed_jobs", lambda: self._failed_across_queues(limit))
        out = []
        for failed_id, raw in found:
            failed = self._failed_from(failed_id, raw)
            if failed is not None:
                out.append(failed)
        return out

    def _failed_across_queues(self, limit: int) -> list[tuple[str, Any]]:
        """The ``limit`` latest failures over every queue's index, latest first, with their records."""
        keys, queues = self.keys, self._queue_list()
        pipe = self._client.pipeline(transaction=False)
        for queue in queues:
            pipe.zrevrange(keys.failed_index(queue), 0, limit - 1, withscores=True)
        latest = sorted(
            ((score, failed_id, queue) for queue, rows in zip(queues, pipe.execute(), strict=True)
             for failed_id, score in rows),
            reverse=True,
        )[:limit]
        if not latest:
            return []
        pipe = self._client.pipeline(transaction=False)
        for _, failed_id, queue in latest:
            pipe.hget(keys.failed(queue), failed_id)
        return [(failed_id.decode(), raw) for (_, failed_id, _), raw in zip(latest, pipe.execute(), strict=True)]

    def failed_count(self) -> int:
        keys = self.keys
        if not self.cluster:
            return int(self._call("failed_count", lambda: self._client.zcard(keys.failed_index(""))))

        def count() -> int:
            pipe = self._client.pipeline(transaction=False)
            for queue in self._queue_list():
                pipe.zcard(keys.failed_index(queue))
            return sum(int(n) for n in pipe.execute())

        return self._call("failed_count", count)

    def _find_failed(self, id: str) -> tuple[str, Any]:
        """Which queue's failed store holds ``id`` (``""`` on one server: there is one store) and its record."""
        keys = self.keys
        if not self.cluster:
            return "", self._client.hget(keys.failed(""), id)
        queues = self._queue_list()
        pipe = self._client.pipeline(transaction=False)
        for queue in queues:
            pipe.hget(keys.failed(queue), id)
        for queue, raw in zip(queues, pipe.execute(), strict=True):
            if raw is not None:
                return queue, raw
        return "", None

    def retry_failed(self, id: str) -> bool:
        store, raw = self._call("retry_failed", lambda: self._find_failed(id))
        if raw is None:
            return False
        pushed = self._retry_args(id, raw)
        keys = self.keys
        if self.cluster:
            pushed[0] = store  # back onto the queue whose store it was in: one slot
            self._register([store])
        queue = pushed[0]
        names = [keys.failed(store), keys.failed_index(store), keys.bands(queue), keys.delayed(queue)]
        names.append(keys.wake_sent(queue))
        if not self.cluster:
            names.append(keys.queues())

        def retry() -> Any:
            now = _num(_clock.now())
            pushed[3] = now  # due at once
            return self._run("retry", names, [id, now, *pushed, keys.channel()])

        return bool(self._call("retry_failed", retry))

    def _retry_args(self, id: str, raw: bytes) -> list[Any]:
        """``push()``'s arguments for a failed job going back on its queue, due time
        left to fill in; PayloadError when its record cannot be read."""
        try:
            record = decode_json(raw)
            raw_fields = record.get("raw")
            if isinstance(raw_fields, str):
                # An unreadable entry goes back as it came, so whoever repairs the
                # consumer (or the producer) gets another go at it.
                fields = decode_json(raw_fields)
                wire = record["job"]
                return [wire["queue"], str(int(wire.get("priority", 0))), "0", None, fields.get("j", raw_fields)]
            job = QueuedJob.from_wire(record.get("job"), connection=self.connection)
            job.attempts = 0
            queue, priority, attempts, _, _ = _line(job).split("\t", 4)
            # as ASCII JSON: a lone surrogate the job came in with (a "\\ud800" escape) goes back the same way
            return [queue, priority, attempts, None, _record(job.to_wire())]
        except Exception as exc:  # noqa: BLE001 - any record nobody can read is refused the same way
            raise PayloadError(
                f"failed job {id!r} cannot be retried: its record is unreadable: {type(exc).__name__}: {exc}"
            ) from None

    def forget_failed(self, id: str) -> bool:
        keys = self.keys

        def forget() -> Any:
            store, raw = self._find_failed(id) if self.cluster else ("", True)
            if raw is None:
                return 0
            return self._run("forget", [keys.failed(store), keys.failed_index(store)], [id])

        return bool(self._call("forget_failed", forget))
