"""The Redis driver's failed store: ``Pfailed`` (records by id) and
``Pfailed:index`` (ids by when they failed)."""

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

        def read() -> tuple[Any, Any]:
            ids: Any = self._client.zrevrange(self.prefix + "failed:index", 0, limit - 1)
            return ids, (self._client.hmget(self.prefix + "failed", ids) if ids else [])

        ids, records = self._call("failed_jobs", read)
        out = []
        for failed_id, raw in zip(ids, records, strict=True):
            failed = self._failed_from(failed_id.decode(), raw)
            if failed is not None:
                out.append(failed)
        return out

    def failed_count(self) -> int:
        return int(self._call("failed_count", lambda: self._client.zcard(self.prefix + "failed:index")))

    def retry_failed(self, id: str) -> bool:
        raw: Any = self._call("retry_failed", lambda: self._client.hget(self.prefix + "failed", id))
        if raw is None:
            return False
        pushed = self._retry_args(id, raw)

        def retry() -> Any:
            now = _num(_clock.now())
            pushed[3] = now  # due at once
            return self._scripts["retry"](args=[self.prefix, now, id, *pushed])

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
        return bool(self._call("forget_failed", lambda: self._scripts["forget"](args=[self.prefix, id])))
