"""Claiming jobs and settling claimed ones: the ``FOR UPDATE SKIP LOCKED`` path
(PostgreSQL), the optimistic path (any dialect) and SQLite's single statement;
acknowledgements, give-backs, releases and renewals of reservations."""

from __future__ import annotations

import uuid
from typing import Any, Sequence

from ... import _clock
from ...errors import PayloadError
from ...types import ExceptionInfo, QueuedJob
from ..base import as_job_list
from ._core import DatabaseCore, column_text, log
from ._schema import CHANNEL, JOBS
from .counting import CountItem, claim_counting, same_database
from .url import SQLITE

_COLUMNS = "seq, id, queue, name, body, attempts, priority, available_at"
#: SQLite keeps whatever a column is given: the text columns come back as bytes
#: and are decoded here, so one row that is not UTF-8 cannot fail the whole claim.
_SQLITE_COLUMNS = (
    "seq, CAST(id AS BLOB), queue, CAST(name AS BLOB), CAST(body AS BLOB), attempts, priority, available_at"
)
#: More attempts than this is no count of real attempts: the row is unreadable. The
#: claim adds one to at most this, so a corrupt count cannot overflow the column.
_MOST_ATTEMPTS = 1_000_000
_INT_MAX = 2**31 - 1


class Claims(DatabaseCore):
    """The consumer side of ``DatabaseQueue``: what one owning loop calls."""

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self._reserve(queues, limit, ())

    def acknowledge_and_reserve(self, done: Sequence[QueuedJob], queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """On PostgreSQL one statement deletes the finished jobs and claims the next
        batch; on SQLite one transaction does both. Either way it is atomic: when it
        raises, neither happened."""
        if not self.capabilities.combined_claim or limit <= 0:
            return super().acknowledge_and_reserve(done, queues, limit)
        done = list(done)
        if len(done) > 500:
            self.acknowledge_many(done[:-500])
            done = done[-500:]
        return self._reserve(queues, limit, done)

    def _reserve(self, queues: Sequence[str], limit: int, acks: Sequence[QueuedJob]) -> list[QueuedJob]:
        if limit <= 0:
            if acks:
                self.acknowledge_many(acks)
            return []
        taken: list[QueuedJob] = []
        for queue in queues:
            want = limit - len(taken)
            if want <= 0:
                break
            try:
                if self.claim == "skip_locked":
                    rows = self._claim_skip_locked(queue, want, acks)
                elif self.dialect == SQLITE:
                    rows = self._claim_sqlite(queue, want, acks)
                else:
                    rows = self._claim_optimistic(queue, want)
            except Exception:
                if not taken:
                    raise
                # What is claimed is reserved to us: hand it out rather than leave
                # it to wait out its reservation with nobody running it.
                log.warning(
                    "claiming jobs on queue %r failed; handing out the %d already claimed",
                    queue,
                    len(taken),
                    exc_info=True,
                )
                break
            acks = ()
            taken.extend(self._decode_claimed(rows))
        if acks:  # no queue was tried
            self.acknowledge_many(acks)
        return taken

    def _claim_skip_locked(self, queue: str, limit: int, acks: Sequence[QueuedJob] = ()) -> list[tuple[Any, ...]]:
        token = uuid.uuid4().hex
        held: list[Any] = []
        sql = "WITH "
        if acks:
            where, held = self._held(acks)
            # Unreferenced, yet run: PostgreSQL always carries out a data-modifying WITH.
            sql += f"acked AS (DELETE FROM {JOBS} WHERE {where}), "
        sql += (
            f"c AS (SELECT seq FROM {JOBS} WHERE queue = %s AND reserved_at IS NULL AND available_at <= %s "
            "ORDER BY priority, available_at, seq LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"UPDATE {JOBS} j SET reserved_at = %s, reserved_until = %s, token = %s, "
            f"attempts = LEAST(j.attempts, {_MOST_ATTEMPTS}) + 1 "
            "FROM c WHERE j.seq = c.seq "
            "RETURNING j.seq, j.id, j.queue, j.name, j.body, j.attempts, j.priority, j.available_at, j.token"
        )
        reservation = self.reservation

        def params() -> list[Any]:
            now = _clock.now()
            return [*held, queue, now, limit, now, now + reservation, token]

        rows: list[tuple[Any, ...]] = self._worker.stamped(sql, params, fetch=True)
        return rows

    def _claim_sqlite(self, queue: str, limit: int, acks: Sequence[QueuedJob] = ()) -> list[tuple[Any, ...]]:
        # One statement: SQLite runs it under its write lock, and the conditional
        # update still decides, so a second process can never claim the same row.
        # A due time SQLite holds as text (not a number) would sort after every
        # number, never due: it is claimed, so that reading it moves it aside.
        # An attempt count SQLite holds as text, a real or a blob is left as it is
        # (text sorts above every number: min() would make it 1,000,001), so that
        # reading it reports what it holds.
        token = uuid.uuid4().hex
        sql = (
            f"UPDATE {JOBS} SET reserved_at = ?, reserved_until = ?, token = ?, "
            f"attempts = CASE typeof(attempts) WHEN 'integer' THEN min(attempts, {_MOST_ATTEMPTS}) + 1 "
            "ELSE attempts END "
            f"WHERE seq IN (SELECT seq FROM {JOBS} WHERE queue = ? AND reserved_at IS NULL "
            "AND (available_at <= ? OR typeof(available_at) NOT IN ('real', 'integer')) "
            "ORDER BY priority, available_at, seq LIMIT ?) AND reserved_at IS NULL "
            f"RETURNING {_SQLITE_COLUMNS}, token"
        )
        reservation = self.reservation

        def params() -> tuple[Any, ...]:
            now = _clock.now()
            return (now, now + reservation, token, queue, now, limit)

        if not acks:
            rows: list[tuple[Any, ...]] = self._worker.stamped(sql, params, fetch=True)
            return rows
        where, held = self._held(acks)
        delete = self._sql(f"DELETE FROM {JOBS} WHERE {where}")

        def both(cursor: Any) -> list[tuple[Any, ...]]:
            cursor.execute(delete, held)
            cursor.execute(sql, params())  # the write lock is held: "now" is now
            return list(cursor.fetchall())

        return self._worker.transaction(both)

    def _claim_optimistic(self, queue: str, limit: int) -> list[tuple[Any, ...]]:
        """The portable claim: read candidates, then claim those still free with a
        conditional UPDATE; a candidate another worker took is simply not ours."""
        claimed: list[tuple[Any, ...]] = []
        for _ in range(5):
            try:
                want = limit - len(claimed)

                def due(want: int = want) -> tuple[Any, ...]:
                    return (queue, _clock.now(), want)

                candidates = [
                    row[0]
                    for row in self._worker.query(
                        f"SELECT seq FROM {JOBS} WHERE queue = %s AND reserved_at IS NULL AND available_at <= %s "
                        "ORDER BY priority, available_at, seq LIMIT %s",
                        due,
                    )
                ]
                if not candidates:
                    break
                token = uuid.uuid4().hex
                marks = self._sql.marks(len(candidates))
                update = (
                    f"UPDATE {JOBS} SET reserved_at = %s, reserved_until = %s, token = %s, "
                    f"attempts = LEAST(attempts, {_MOST_ATTEMPTS}) + 1 "
                    f"WHERE seq IN ({marks}) AND reserved_at IS NULL"
                )

                def params(token: str = token, candidates: list[Any] = candidates) -> tuple[Any, ...]:
                    now = _clock.now()
                    return (now, now + self.reservation, token, *candidates)

                if not self._sql.returning:
                    won = self._worker.stamped(update, params)
                    rows = (
                        self._worker.query(
                            f"SELECT {_COLUMNS}, token FROM {JOBS} WHERE seq IN ({marks}) AND token = %s",
                            (*candidates, token),
                        )
                        if won
                        else []
                    )
                else:
                    rows = self._worker.stamped(update + f" RETURNING {_COLUMNS}, token", params, fetch=True)
            except Exception:
                if not claimed:
                    raise
                # The rows of earlier rounds are reserved to us: hand them out.
                log.warning("claiming more jobs on queue %r failed; handing out those claimed", queue, exc_info=True)
                break
            claimed.extend(rows)
            if len(claimed) >= limit or len(candidates) < want:
                break
        return claimed

    def _decode_claimed(self, rows: Sequence[tuple[Any, ...]]) -> list[QueuedJob]:
        """The claimed rows as jobs, in the queue's order. A row that cannot be read,
        whatever the reason, goes alone to the failed store; the rest are handed out."""
        jobs: list[QueuedJob] = []
        for row in rows:
            try:
                jobs.append(self._read_claimed(row))
            except Exception as exc:  # noqa: BLE001 - any failure to read one row: that row alone is set aside
                try:
                    self._discard(row, exc)
                except Exception:  # noqa: BLE001 - it stays reserved, lapses, and is moved on a later claim
                    log.warning(
                        "could not move unreadable job %s to the failed store", column_text(row[1]), exc_info=True
                    )
        jobs.sort(key=_claim_order)
        return jobs

    def _read_claimed(self, row: tuple[Any, ...]) -> QueuedJob:
        seq, job_id, queue, name, body, attempts, priority, available_at, token = row
        if type(body) is bytes:
            try:
                body = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PayloadError(f"its body is not UTF-8 text ({exc})") from None
        job = QueuedJob.decode(body, connection=self.connection, receipt=(int(seq), token))
        job.id = job_id if type(job_id) is str else job_id.decode("utf-8")
        job.queue = queue
        # Counted by the claim: at least 1, unless the row held a negative count.
        if type(attempts) is not int:
            raise PayloadError(f"its stored attempt count {attempts!r} is not a whole number")
        if attempts < 1:
            raise PayloadError(f"its stored attempt count {attempts - 1} is negative")
        if attempts > _MOST_ATTEMPTS:
            raise PayloadError(f"its stored attempt count is absurd (more than {_MOST_ATTEMPTS:,})")
        job.attempts = attempts
        if type(priority) is not int:
            raise PayloadError(f"its stored priority {priority!r} is not a whole number")
        job.priority = priority
        if type(available_at) is not float:
            if type(available_at) is not int:
                raise PayloadError(f"its stored available_at {available_at!r} is not a time")
            available_at = float(available_at)
        if available_at - available_at:
            raise PayloadError(f"its stored available_at {available_at!r} is not a time")
        job.available_at = available_at
        return job

    def _discard(self, row: tuple[Any, ...], exc: Exception) -> None:
        """A row nobody can run: alone into the failed store, saying why, and announced."""
        seq, job_id, queue, name, body, attempts, _, _, token = row
        job_id, name, raw = column_text(job_id), column_text(name), column_text(body)
        detail = str(exc) if isinstance(exc, PayloadError) else f"{type(exc).__name__}: {exc}"
        reason = PayloadError(f"job {job_id!r} (queue {queue!r}) cannot be read: {detail}")
        reason.__cause__ = exc
        info = ExceptionInfo.from_exception(reason)
        log.error("job %s (%s) on queue %r cannot be read and was failed: %s", job_id, name, queue, info.error)
        count = attempts if type(attempts) is int and 0 <= attempts <= _INT_MAX else 0
        moved = []

        def move(cursor: Any) -> None:
            cursor.execute(self._sql(f"DELETE FROM {JOBS} WHERE seq = %s AND token = %s"), (int(seq), token))
            if cursor.rowcount == 0:
                return  # no longer ours: whoever holds it now decides
            values = self._failed_row(job_id, queue, name, raw, info, count, _clock.now())
            cursor.execute(self._sql(self._sql.upsert_failed()), values)
            moved.append(True)

        self._worker.transaction(move)
        if moved:
            self.announce_discarded(info, raw)

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        if not jobs:
            return
        for start in range(0, len(jobs), 500):
            where, params = self._held(jobs[start : start + 500])
            self._worker.execute(f"DELETE FROM {JOBS} WHERE {where}", params)

    # -- counting the jobs of batches with their acknowledgements (see .counting) ----------------
    def counts_batches_of(self, store: Any) -> bool:
        return same_database(self, store)

    def acknowledge_counting(
        self, done: Sequence[QueuedJob], counts: Sequence[CountItem], queues: Sequence[str], limit: int
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """On PostgreSQL's claim, acknowledge ``done``, count those of ``counts`` in
        one statement with the next claim; a job of ``counts`` whose batch the round
        could finish is left held, and returned, as every one is on the other paths."""
        done = list(done)
        if self.claim != "skip_locked" or not counts or len(done) > 500:
            members = {id(item[0]) for item in counts}
            rest = [job for job in done if id(job) not in members]
            taken = self.acknowledge_and_reserve(rest, queues, limit) if rest or limit > 0 else []
            return taken, [item[0] for item in counts]
        queues = list(queues) if limit > 0 else []
        first, most = (queues[0], limit) if queues else ("", 0)
        rows, left = claim_counting(self, first, most, done, counts, _MOST_ATTEMPTS)
        taken = self._decode_claimed(rows)
        if queues[1:] and len(taken) < limit:
            try:
                taken.extend(self._reserve(queues[1:], limit - len(taken), ()))
            except Exception:  # noqa: BLE001 - what is claimed is ours: hand it out
                log.warning("claiming jobs failed; handing out the %d already claimed", len(taken), exc_info=True)
        if not left:
            return taken, []
        by_seq = {item[0].receipt[0]: item[0] for item in counts}
        return taken, [by_seq[seq] for seq in left]

    def acknowledge_handing_over(self, job: QueuedJob, follow: Sequence[QueuedJob]) -> None:
        """Delete ``job``'s row and insert ``follow`` in one transaction, only when
        the delete found the row still held by ``job``'s claim: a reservation that
        lapsed and was claimed again leaves the hand-over to the run that holds it,
        and a transaction sent again after its commit's reply was lost stores nothing."""
        where, params = self._held([job])
        delete = self._sql(f"DELETE FROM {JOBS} WHERE {where}")

        def settle(cursor: Any) -> None:
            cursor.execute(delete, params)
            if cursor.rowcount == 1:
                self._insert_follow(cursor, follow)

        self._worker.transaction(settle)
        if follow:
            self._wake_local()

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs are free again at once, their attempt uncounted: one
        transaction, so a failure leaves every one of them still reserved."""
        jobs = list(jobs)
        if not jobs:
            return
        statements = []
        for start in range(0, len(jobs), 500):
            where, params = self._held(jobs[start : start + 500])
            update = (
                f"UPDATE {JOBS} SET reserved_at = NULL, reserved_until = NULL, token = NULL, "
                "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END "
                f"WHERE reserved_at IS NOT NULL AND {where}"
            )
            statements.append((self._sql(self._sql.notifying(update, distinct=True)), params))

        def run(cursor: Any) -> None:
            for sql, params in statements:
                cursor.execute(sql, params)

        self._worker.transaction(run)
        self._wake_local()

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self._put_back(job, delay, "")

    def defer(self, job: QueuedJob, delay: float) -> None:
        """Due again in ``delay`` seconds, its attempt uncounted."""
        self._put_back(job, delay, ", attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END")

    def _put_back(self, job: QueuedJob, delay: float, uncount: str) -> None:
        delay = max(0.0, float(delay))
        where, params = self._held([job])
        update = (
            f"UPDATE {JOBS} SET reserved_at = NULL, reserved_until = NULL, token = NULL, available_at = %s{uncount} "
            f"WHERE {where}"
        )
        # Idle workers in other processes looked for the soonest job while this
        # one was reserved: tell them, on commit, so they wake when it is due.
        update = self._sql.notifying(update)
        self._worker.stamped(update, lambda: [_clock.now() + delay, *params], fetch=self._sql.notifies)
        self._wake_local()  # a delayed one too: a waiting worker then sleeps until it is due

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        held = as_job_list(jobs)
        if not held:
            return
        period = self.reservation if seconds is None else float(seconds)
        for start in range(0, len(held), 500):
            batch = held[start : start + 500]
            where, params = self._held(batch)

            # The deadline is read when the UPDATE runs, also after a reconnect that
            # took longer than the reservation: never one already in the past.
            def renewal(params: list[Any] = params) -> list[Any]:
                return [_clock.now() + period, *params]

            renewed: int = self._worker.stamped(
                f"UPDATE {JOBS} SET reserved_until = %s WHERE reserved_at IS NOT NULL AND {where}", renewal
            )
            if renewed < len(batch):
                self._take_back(batch, period)

    def _take_back(self, jobs: Sequence[QueuedJob], period: float) -> None:
        """Reserve again, with their own tokens, the running jobs whose reservation
        lapsed and was reclaimed while nobody claimed them since: they are still
        running here, and another worker must not start them a second time."""
        by_token: dict[str, list[int]] = {}
        for job in jobs:
            if isinstance(job.receipt, tuple):
                seq, token = job.receipt
                by_token.setdefault(token, []).append(int(seq))
        for token, seqs in by_token.items():

            def params(token: str = token, seqs: list[int] = seqs) -> list[Any]:
                now = _clock.now()
                return [now, now + period, token, *seqs]

            taken = self._worker.stamped(
                f"UPDATE {JOBS} SET reserved_at = %s, reserved_until = %s, token = %s "
                f"WHERE seq IN ({self._sql.marks(len(seqs))}) AND reserved_at IS NULL AND token IS NULL",
                params,
            )
            if taken:
                log.warning("took back %d running job(s) whose reservation had lapsed and been reclaimed", taken)

    def reclaim_expired(self) -> int:
        reclaimed: int = self._worker.stamped(
            f"UPDATE {JOBS} SET reserved_at = NULL, reserved_until = NULL, token = NULL "
            "WHERE reserved_at IS NOT NULL AND reserved_until <= %s",
            lambda: (_clock.now(),),
        )
        if reclaimed > 0:
            if self._sql.notifies:
                self._worker.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            self._wake_local()
        return reclaimed


def _claim_order(job: QueuedJob) -> tuple[int, float, int]:
    return (job.priority, job.available_at, job.receipt[0])
