"""The failed store: moving a job there, listing, retrying and forgetting failed jobs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from ... import _clock
from ...types import ExceptionInfo, FailedJob, QueuedJob, as_exception_info, decode
from ._core import DatabaseCore, column_text
from ._schema import FAILED, JOBS
from .counting import After, CountItem, Uncount, settle_counting


class FailedTable(DatabaseCore):
    """Failed jobs, each kept once by id, until retried or forgotten."""

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        return self._fail(job, error, ())

    def fail_handing_over(
        self, job: QueuedJob, error: BaseException | str | ExceptionInfo, follow: Sequence[QueuedJob]
    ) -> FailedJob:
        """Move ``job`` to the failed store and insert ``follow`` in one transaction,
        only when ``job`` was still there to move."""
        return self._fail(job, error, follow)

    def _fail(
        self, job: QueuedJob, error: BaseException | str | ExceptionInfo, follow: Sequence[QueuedJob]
    ) -> FailedJob:
        info = as_exception_info(error)
        when: list[float] = []

        def move(cursor: Any) -> None:
            when[:] = [_clock.now()]
            if self._move_failed(cursor, job, info, when[0]):
                self._insert_follow(cursor, follow)

        self._worker.transaction(move)
        if follow:
            self._wake_local()
        return FailedJob.of(replace(job, connection=self.connection, receipt=None), info, when[0])

    def settle_counting(self, settled: Sequence[tuple[CountItem, ExceptionInfo | None]], after: After) -> None:
        """Remove each job's row (a failed one, with its error, to the failed store)
        and count those removed in their batches, in one transaction (:mod:`.counting`)."""
        settle_counting(self, settled, self._move_failed, after)

    def _move_failed(self, cursor: Any, job: QueuedJob, info: ExceptionInfo, when: float) -> bool:
        """In the caller's transaction: ``job``'s row to the failed store; False when
        the row was not there to move."""
        where, params = self._held([job])
        if isinstance(job.receipt, tuple):
            # Ours, or lapsed and reclaimed but not claimed again: the attempt that
            # just failed was its last, so it leaves the jobs table either way.
            where = "seq = %s AND (token = %s OR reserved_at IS NULL)"
            params = list(job.receipt)
        cursor.execute(self._sql(f"DELETE FROM {JOBS} WHERE {where}"), tuple(params))
        if cursor.rowcount == 0:
            # Another worker claimed it again after our reservation lapsed (or it
            # is gone): its run decides; a failed copy here would let a retry
            # queue the job twice.
            return False
        stored = replace(job, connection=self.connection, receipt=None)
        cursor.execute(
            self._sql(self._sql.upsert_failed()),
            self._failed_row(job.id, job.queue, job.name, stored.encode(), info, job.attempts, when),
        )
        return True

    def _failed_from_row(self, row: tuple[Any, ...]) -> FailedJob:
        job_id, queue, name, body, error, exception, attempts, failed_at = row
        # Listed whatever it holds: the failed store is where unreadable jobs go.
        try:
            job: QueuedJob | None = QueuedJob.decode(body, connection=self.connection)
        except Exception:  # noqa: BLE001 - listed without its envelope
            job = None
        try:
            info = ExceptionInfo.from_dict(decode(exception))
        except Exception:  # noqa: BLE001 - the error string says it
            info = ExceptionInfo.from_message(str(error))
        count = attempts if type(attempts) is int else 0
        return FailedJob(
            id=column_text(job_id),
            name=column_text(name),
            queue=column_text(queue),
            connection=self.connection,
            payload=job.payload if job is not None else {},
            error=column_text(error),
            exception=info,
            failed_at=float(failed_at) if isinstance(failed_at, (int, float)) else 0.0,
            attempts=count,
            max_attempts=job.max_attempts if job is not None else count,
            job=job,
        )

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        rows = self._backend.query(
            f"SELECT id, queue, name, body, error, exception, attempts, failed_at FROM {FAILED} "
            "ORDER BY failed_at DESC, seq DESC LIMIT %s",
            (int(limit),),
        )
        return [self._failed_from_row(row) for row in rows]

    def failed_count(self) -> int:
        return int(self._backend.query(f"SELECT count(*) FROM {FAILED}")[0][0])

    def retry_failed(self, id: str) -> bool:
        return self._retry(id, None)

    def retry_failed_counting(self, id: str, tally: str, ttl: float) -> bool:
        """:meth:`retry_failed` of a failed job of a batch whose tally (``tally``) is
        in this database: its failure taken out of the tally in the same transaction."""
        return self._retry(id, Uncount(self, tally, ttl))

    def _retry(self, id: str, uncount: Uncount | None) -> bool:
        sql = self._sql

        def move(cursor: Any) -> bool:
            if uncount is not None:
                uncount.take(cursor)
            now = _clock.now()
            cursor.execute(sql(f"SELECT queue, name, body FROM {FAILED} WHERE id = %s"), (id,))
            row = cursor.fetchone()
            if row is None:
                return False
            queue, name, body = row
            priority = 0
            try:
                job = QueuedJob.decode(body)
            except Exception:  # noqa: BLE001 - queued as it was; the claim moves it back, saying why
                pass
            else:
                job.attempts = 0
                job.available_at = now
                body, priority = job.encode(), job.priority
            cursor.execute(sql(f"DELETE FROM {FAILED} WHERE id = %s"), (id,))
            if cursor.rowcount == 0:
                # A concurrent retry deleted it first (PostgreSQL and MariaDB read the
                # row above without a lock): that one queues it, this one must not.
                return False
            cursor.execute(sql(sql.insert_one()), (id, queue, name, body, 0, priority, now))
            if uncount is not None:
                uncount.apply(cursor, id, now)
            return True

        retried = self._backend.transaction(move)
        if retried:
            self._wake_local()
        return retried

    def forget_failed(self, id: str) -> bool:
        return self._backend.execute(f"DELETE FROM {FAILED} WHERE id = %s", (id,)) > 0
