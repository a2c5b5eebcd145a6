"""Counting the jobs of batches in the transactions that settle them.

When the lock store that keeps the batches' tallies is the queue's own database
(``driver.lock_store()``, or a ``DatabaseLockStore`` on the same database), a
worker counts a finished job of a batch in the very transaction that removes
its row: the row is removed once, by the claim that holds it, so the job
counts once without a row of its own in the tally's members, and a job whose
count is lost to a crash is not acknowledged either.

Two ways, both taking a tally's ``pending`` row first, as every change of a
tally does:

- :func:`claim_counting` (PostgreSQL's claim): the acknowledgements, the counts
  and the next claim in one statement, for every batch the round cannot finish
  (its ``pending`` stays above zero, so no callback is due). The jobs of a
  batch the round could finish are left held, for the other way.
- :func:`settle_counting`: one transaction that removes each job's row (or
  moves it to the failed store), counts those it removed, then hands the
  counts to ``after``, which queues the callbacks they call for (before the
  commit: a crash then runs the jobs again, and the callbacks' once-keys keep
  them to one run) and may cancel a batch in the same transaction.

A retry of a failed job of a batch takes its failure back out of the tally in
the transaction that queues it again (:class:`Uncount`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import _clock
from ...types import ExceptionInfo, QueuedJob
from ._schema import JOBS, TALLIES, TALLY_MEMBERS
from .store import DatabaseLockStore
from .url import SQLITE

if TYPE_CHECKING:
    from ._core import DatabaseCore

#: ``(job, tally key, field, ttl)``: a finished job to count in its batch's tally.
CountItem = tuple[QueuedJob, str, str, float]
#: Given the counts by tally key and the keys that counted a failure, and a way to
#: cancel a batch in the transaction (its counts after), queues what they call for.
After = Callable[[dict[str, dict[str, int]], set[str], Callable[[str], dict[str, int]]], None]

__all__ = ["CountItem", "After", "same_database", "claim_counting", "settle_counting", "Uncount"]


class Uncount:
    """A retry's part in its job's batch (:meth:`.failed.FailedTable.retry_failed_counting`):
    in the transaction that queues the failed job again, the batch's ``pending``
    row is taken first (as every change of a tally does), then its failure is
    taken out of the tally (failed -1, pending +1, and its member row, if it
    has one, goes), so that its next outcome counts once."""

    def __init__(self, core: DatabaseCore, key: str, ttl: float) -> None:
        self._sql = core._sql
        self._lock = "" if core.dialect == SQLITE else " FOR UPDATE"
        self.key, self.ttl = key, float(ttl)

    def take(self, cursor: Any) -> None:
        """Before anything else of the retry: the tally's ``pending`` row."""
        sql = f"SELECT n FROM {TALLIES} WHERE tally_key = %s AND field = 'pending'{self._lock}"
        cursor.execute(self._sql(sql), (self.key,))
        cursor.fetchall()

    def apply(self, cursor: Any, member: str, now: float) -> None:
        """Once the failed job is queued again: its failure out of the tally."""
        sql, key = self._sql, self.key
        cursor.execute(sql(f"DELETE FROM {TALLY_MEMBERS} WHERE tally_key = %s AND member = %s"), (key, member))
        update = sql(f"UPDATE {TALLIES} SET n = n + %s WHERE tally_key = %s AND field = %s")
        for field, n in (("pending", 1), ("failed", -1)):
            cursor.execute(update, (n, key, field))
        cursor.execute(sql(f"UPDATE {TALLIES} SET expires_at = %s WHERE tally_key = %s"), (now + self.ttl, key))


def same_database(core: DatabaseCore, store: Any) -> bool:
    """Whether ``store`` keeps its tallies in ``core``'s database."""
    if not isinstance(store, DatabaseLockStore):
        return False
    ours, theirs = core._backend.target, store._backend.target
    return (ours.dialect, ours.where, ours.options.get("options", "")) == (
        theirs.dialect,
        theirs.where,
        theirs.options.get("options", ""),
    )


def _keys(counts: Sequence[CountItem]) -> tuple[list[str], list[float], list[int]]:
    """Each tally once, in key order: how long it is kept, and how many of the round are its."""
    ttls: dict[str, float] = {}
    many: dict[str, int] = {}
    for _, key, _, ttl in counts:
        ttls[key] = max(ttls.get(key, 0.0), float(ttl))
        many[key] = many.get(key, 0) + 1
    keys = sorted(ttls)
    return keys, [ttls[key] for key in keys], [many[key] for key in keys]


def claim_counting(
    core: DatabaseCore,
    queue: str,
    limit: int,
    acks: Sequence[QueuedJob],
    counts: Sequence[CountItem],
    most_attempts: int,
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """PostgreSQL: acknowledge ``acks``, count those of ``counts`` whose batch stays
    pending, and claim up to ``limit`` jobs of ``queue``, in one statement. The
    claimed rows, and the ``seq`` of each job of ``counts`` left held (its batch
    could finish in this round)."""
    where, held = core._held(acks)
    keys, ttls, many = _keys(counts)
    # Each (tally, field) once, numbered; the seqs go as an array literal: psycopg
    # would dump a list element by element in Python.
    pairs: dict[tuple[str, str], int] = {}
    for _, key, field, _ in counts:
        pairs.setdefault((key, field), len(pairs))
    seq_text = "{" + ",".join(str(job.receipt[0]) for job, _, _, _ in counts) + "}"
    claim = f"""c AS (SELECT seq FROM {JOBS} WHERE queue = %s AND reserved_at IS NULL AND available_at <= %s
      ORDER BY priority, available_at, seq LIMIT %s FOR UPDATE SKIP LOCKED),
claimed AS (UPDATE {JOBS} j SET reserved_at = %s, reserved_until = %s, token = %s,
            attempts = LEAST(j.attempts, {most_attempts}) + 1 FROM c WHERE j.seq = c.seq
            RETURNING j.seq, j.id, j.queue, j.name, j.body, j.attempts, j.priority, j.available_at, j.token)
SELECT seq, id, queue, name, body, attempts, priority, available_at, token FROM claimed"""
    token = uuid.uuid4().hex
    reservation = core.reservation
    if len(pairs) == 1 and len(counts) == len(acks):
        # The usual round: every job acknowledged is one batch's, counted in one
        # field; its count is the number of rows the delete removed.
        ((key, field),) = pairs
        sql = f"""WITH pl AS (SELECT n FROM {TALLIES} WHERE tally_key = %s AND field = 'pending' FOR UPDATE),
safe AS (SELECT 1 FROM pl WHERE n - %s > 0),
acked AS (DELETE FROM {JOBS} WHERE {where} AND EXISTS (SELECT 1 FROM safe) RETURNING seq),
counts AS (UPDATE {TALLIES} t SET expires_at = %s, n = t.n + CASE t.field
           WHEN 'pending' THEN -(SELECT count(*) FROM acked) WHEN %s THEN (SELECT count(*) FROM acked) ELSE 0 END
           WHERE t.tally_key = %s AND EXISTS (SELECT 1 FROM safe) RETURNING t.tally_key),
{claim}
UNION ALL SELECT s, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM unnest(%s::text::bigint[]) s
WHERE NOT EXISTS (SELECT 1 FROM safe)"""

        def params() -> list[Any]:
            now = _clock.now()
            return [
                key, len(counts), *held, now + ttls[0], field, key,
                queue, now, limit, now, now + reservation, token, seq_text,
            ]  # fmt: skip

    else:
        sql = f"""WITH g (gi, tally_key, field) AS (
    SELECT (ordinality - 1)::int, k, f FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u (k, f)),
bm (seq, gi) AS (SELECT * FROM unnest(%s::text::bigint[], %s::text::int[])),
bk (tally_key, ttl, c) AS (SELECT * FROM unnest(%s::text[], %s::float8[], %s::int[])),
pl AS (SELECT tally_key, n FROM {TALLIES} WHERE field = 'pending' AND tally_key IN (SELECT tally_key FROM bk)
       ORDER BY tally_key FOR UPDATE),
safe AS (SELECT bk.tally_key, %s::float8 + bk.ttl AS until FROM bk JOIN pl USING (tally_key) WHERE pl.n - bk.c > 0),
held AS (SELECT seq FROM bm WHERE gi IN (SELECT gi FROM g WHERE tally_key NOT IN (SELECT tally_key FROM safe))),
acked AS (DELETE FROM {JOBS} WHERE {where} AND seq NOT IN (SELECT seq FROM held) RETURNING seq),
d AS (SELECT g.tally_key, g.field, count(*) AS c FROM bm JOIN acked USING (seq) JOIN g USING (gi) GROUP BY 1, 2),
counts AS (UPDATE {TALLIES} t SET expires_at = s.until, n = t.n + CASE WHEN t.field = 'pending'
           THEN -(SELECT coalesce(sum(d.c), 0) FROM d WHERE d.tally_key = t.tally_key)
           ELSE (SELECT coalesce(sum(d.c), 0) FROM d WHERE d.tally_key = t.tally_key AND d.field = t.field) END
           FROM safe s WHERE t.tally_key = s.tally_key RETURNING t.tally_key),
{claim}
UNION ALL SELECT seq, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM held"""
        pair_keys = [key for key, _ in pairs]
        pair_fields = [field for _, field in pairs]
        # Each job's pair, by its number, in the order of the seqs.
        index_text = "{" + ",".join(str(pairs[(key, field)]) for _, key, field, _ in counts) + "}"

        def params() -> list[Any]:
            now = _clock.now()
            return [
                pair_keys, pair_fields, seq_text, index_text, keys, ttls, many, now,
                *held, queue, now, limit, now, now + reservation, token,
            ]  # fmt: skip

    rows: list[tuple[Any, ...]] = core._worker.stamped(sql, params, fetch=True)
    claimed = [row for row in rows if row[1] is not None]
    left = [int(row[0]) for row in rows if row[1] is None]
    return claimed, left


def settle_counting(
    core: DatabaseCore,
    settled: Sequence[tuple[CountItem, ExceptionInfo | None]],
    move_failed: Callable[[Any, QueuedJob, ExceptionInfo, float], bool],
    after: After,
) -> None:
    """In one transaction: take each batch's ``pending`` row, remove each job's row
    still held (a failed one, with its ``ExceptionInfo``, to the failed store by
    ``move_failed``), count those removed, and call ``after`` with the counts."""
    sql = core._sql
    lock = "" if core.dialect == SQLITE else " FOR UPDATE"
    keys, ttls, _ = _keys([item for item, _ in settled])

    def run(cursor: Any) -> None:
        now = _clock.now()
        until = {key: now + ttl for key, ttl in zip(keys, ttls, strict=True)}
        for key in keys:
            cursor.execute(sql(f"SELECT n FROM {TALLIES} WHERE tally_key = %s AND field = 'pending'{lock}"), (key,))
            cursor.fetchall()
        deltas: dict[tuple[str, str], int] = {}
        failed: set[str] = set()
        done = [job for (job, _, _, _), info in settled if info is None]
        claimed = all(isinstance(job.receipt, tuple) for job in done)
        gone: set[int] = set()
        if done and claimed:  # one statement for the rows that only go: which were still held
            where, params = core._held(done)
            cursor.execute(sql(f"DELETE FROM {JOBS} WHERE {where} RETURNING seq"), params)
            gone = {int(row[0]) for row in cursor.fetchall()}
        for (job, key, field, _), info in settled:
            if info is not None:
                removed = move_failed(cursor, job, info, now)
            elif claimed:
                removed = job.receipt[0] in gone
            else:
                where, params = core._held([job])
                cursor.execute(sql(f"DELETE FROM {JOBS} WHERE {where}"), params)
                removed = cursor.rowcount == 1
            if removed:
                deltas[(key, field)] = deltas.get((key, field), 0) + 1
                deltas[(key, "pending")] = deltas.get((key, "pending"), 0) - 1
                if field == "failed":
                    failed.add(key)
        for (key, field), n in sorted(deltas.items(), key=lambda item: (item[0][1] != "pending", item[0])):
            _add(cursor, key, field, n)
        counts = {}
        for key in keys:
            cursor.execute(sql(f"UPDATE {TALLIES} SET expires_at = %s WHERE tally_key = %s"), (until[key], key))
            counts[key] = _read(cursor, key)

        def cancel(key: str) -> dict[str, int]:
            _add(cursor, key, "cancelled", 1)
            counts[key] = _read(cursor, key)
            return counts[key]

        after(counts, failed, cancel)

    def _add(cursor: Any, key: str, field: str, n: int) -> None:
        cursor.execute(sql(f"UPDATE {TALLIES} SET n = n + %s WHERE tally_key = %s AND field = %s"), (n, key, field))

    def _read(cursor: Any, key: str) -> dict[str, int]:
        cursor.execute(sql(f"SELECT field, n FROM {TALLIES} WHERE tally_key = %s"), (key,))
        return {str(field): int(n) for field, n in cursor.fetchall()}

    core._worker.transaction(run)
