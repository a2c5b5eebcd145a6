"""Reading the jobs a queue stores (``Capabilities.listing``): a page of one
state's jobs, filtered by name, and one job by id.

Each state is one query on the indexes the claim uses: ``ready`` walks
``rainier_jobs_ready`` in the claim's own order, ``reserved`` walks
``rainier_jobs_reserved``. There is no index on the job id (see
:mod:`._schema`), so :meth:`Browsing.find_job` reads the table.
"""

from __future__ import annotations

from typing import Any

from ... import _clock
from ...errors import PayloadError
from ...types import JobState, ListedJob, QueuedJob
from ..paging import LIKE_ESCAPE, check_page, like_pattern, name_filter
from ._core import column_text
from ._schema import JOBS
from .claims import _COLUMNS, _SQLITE_COLUMNS, Claims
from .url import MYSQL, POSTGRESQL, SQLITE

__all__ = ["Browsing"]

#: Each state: its condition beside ``queue = %s`` (the ``%s`` in it is "now"), and its order.
_STATES: dict[str, tuple[str, str]] = {
    "ready": ("reserved_at IS NULL AND available_at <= %s", "priority, available_at, seq"),
    "delayed": ("reserved_at IS NULL AND available_at > %s", "available_at, seq"),
    "reserved": ("reserved_at IS NOT NULL", "reserved_until, seq"),
}
_READS_NOW = ("ready", "delayed")
#: The characters of an unreadable row's body kept in its listing.
_RAW_SHOWN = 4000
#: Rows read for one id: a collation that ignores case (MariaDB's default) matches ids of another case too.
_SAME_ID = 10


class Browsing(Claims):
    """``list_jobs`` and ``find_job`` of ``DatabaseQueue``."""

    def _listing_columns(self) -> str:
        columns = _SQLITE_COLUMNS if self.dialect == SQLITE else _COLUMNS
        return f"{columns}, token, reserved_until, reserved_at"

    def _name_condition(self) -> str:
        """``name`` contains the pattern's text, ignoring case, on every dialect."""
        if self.dialect == POSTGRESQL:
            return f" AND name ILIKE %s ESCAPE '{LIKE_ESCAPE}'"
        if self.dialect == MYSQL:  # a binary or case-sensitive collation would not ignore case
            return f" AND LOWER(name) LIKE LOWER(%s) ESCAPE '{LIKE_ESCAPE}'"
        return f" AND name LIKE %s ESCAPE '{LIKE_ESCAPE}'"  # SQLite: ASCII letters, whatever their case

    def list_jobs(
        self, queue: str, state: JobState, *, name: str | None = None, offset: int = 0, limit: int = 50
    ) -> list[ListedJob]:
        """A page of ``queue``'s jobs in ``state``, by "now" on the Python clock:
        ``ready`` (due, not reserved) in the claim's order (priority, due time,
        then dispatch), ``delayed`` (due later) by due time, ``reserved`` by when
        the reservation lapses (a lapsed one stays reserved until
        ``reclaim_expired`` frees it).

        ``name`` keeps the jobs whose ``NAME`` contains it, ignoring case (``%``
        and ``_`` are plain characters); a filter reads every job of the state.

        A row that cannot be read is listed as far as its columns can be: its
        id, name, attempts, priority and due time, an empty payload, and
        ``job.meta["unreadable"]`` saying why (``meta["raw"]``: the start of what
        it holds). A worker's claim moves it to the failed store.
        """
        state = check_page(state, offset, limit)
        needle = name_filter(name)
        if limit == 0:
            return []
        pattern = [like_pattern(needle)] if needle is not None else []

        def params() -> list[Any]:
            now = [_clock.now()] if state in _READS_NOW else []
            return [queue, *now, *pattern, int(limit), int(offset)]

        rows = self._backend.query(self._page_sql(state, needle is not None), params)
        return [self._listed(row, state) for row in rows]

    def _page_sql(self, state: JobState, filtered: bool) -> str:
        """The query of one page: queue, ["now"], [name pattern], limit, offset."""
        condition, order = _STATES[state]
        sql = f"SELECT {self._listing_columns()} FROM {JOBS} WHERE queue = %s AND {condition}"
        if filtered:
            sql += self._name_condition()
        return sql + f" ORDER BY {order} LIMIT %s OFFSET %s"

    def find_job(self, id: str) -> ListedJob | None:
        """The job ``id`` (ready, delayed or reserved), or None. Reads the whole
        jobs table, which has no index on the id (one would cost every dispatch)."""
        now = _clock.now()
        rows = self._backend.query(
            f"SELECT {self._listing_columns()} FROM {JOBS} WHERE id = %s ORDER BY seq LIMIT {_SAME_ID}", (id,)
        )
        for row in rows:
            if column_text(row[1]) == id:
                return self._listed(row, _state_of(row, now))
        return None

    def _listed(self, row: tuple[Any, ...], state: JobState) -> ListedJob:
        """A row as a listing shows it, read as the claim reads a row it claimed."""
        seq, job_id, queue, name, body, attempts, priority, available_at, token, reserved_until, _ = row
        # The claim's reading takes the count a claim returns: this attempt counted.
        counted = attempts + 1 if state != "reserved" and type(attempts) is int else attempts
        try:
            job = self._read_claimed((seq, job_id, queue, name, body, counted, priority, available_at, token))
        except Exception as exc:  # noqa: BLE001 - whatever makes it unreadable, the page still shows it
            job = self._unreadable(row, exc)
        else:
            job.attempts = attempts
            job.receipt = None  # a listing is no claim: nothing settles a job through it
        until = reserved_until if state == "reserved" and type(reserved_until) in (float, int) else None
        return ListedJob(job, state, float(until) if until is not None else None)

    def _unreadable(self, row: tuple[Any, ...], exc: Exception) -> QueuedJob:
        """What can be read of a row the claim could not read."""
        _, job_id, queue, name, body, attempts, priority, available_at = row[:8]
        why = str(exc) if isinstance(exc, PayloadError) else f"{type(exc).__name__}: {exc}"
        due = available_at if type(available_at) in (float, int) and available_at - available_at == 0 else 0.0
        return QueuedJob(
            id=column_text(job_id),
            name=column_text(name),
            queue=column_text(queue),
            payload={},
            connection=self.connection,
            attempts=attempts if type(attempts) is int else 0,
            priority=priority if type(priority) is int else 0,
            available_at=float(due),
            meta={"unreadable": why, "raw": column_text(body)[:_RAW_SHOWN]},
        )


def _state_of(row: tuple[Any, ...], now: float) -> JobState:
    """A row's state as the listing queries tell it (a due time that is no number is never due)."""
    available_at, reserved_at = row[7], row[-1]
    if reserved_at is not None:
        return "reserved"
    if type(available_at) in (float, int) and available_at <= now:
        return "ready"
    return "delayed"
