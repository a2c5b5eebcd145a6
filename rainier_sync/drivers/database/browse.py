"""Reading the jobs a queue stores (``Capabilities.listing``): a page of one
state's jobs, filtered by name, and one job by id.

Each page is one query on the indexes the claim uses: ``ready`` walks
``rainier_jobs_ready`` in the claim's own order, ``reserved`` walks
``rainier_jobs_reserved``. The rows of the page are chosen by their ``seq``
alone and only those are then read whole (a deferred join), so an offset or a
name filter walks the index and the ``name`` column, never the bodies. A name
filter first finds the job just past its bound (one more walk of the index),
and stops there. There is no index on the job id (see :mod:`._schema`), so
:meth:`Browsing.find_job` reads the table.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import _clock
from ...errors import PayloadError
from ...types import JobState, ListedJob, QueuedJob
from ..paging import LIKE_ESCAPE, Page, check_page, like_pattern, name_filter
from ._core import column_text
from ._schema import JOBS
from .claims import Claims
from .url import MYSQL, POSTGRESQL, SQLITE

__all__ = ["Browsing"]

#: Each state: its condition beside ``queue = %s`` (the ``%s`` in it is "now"), and its order.
_STATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ready": ("reserved_at IS NULL AND available_at <= %s", ("priority", "available_at", "seq")),
    "delayed": ("reserved_at IS NULL AND available_at > %s", ("available_at", "seq")),
    # reserved_until is never NULL on a reserved row: said, so that MariaDB (whose index on it holds
    # every row, unreserved first) walks the reserved ones only.
    "reserved": ("reserved_at IS NOT NULL AND reserved_until IS NOT NULL", ("reserved_until", "seq")),
}
_READS_NOW = ("ready", "delayed")
_READ = ("seq", "id", "queue", "name", "body", "attempts", "priority", "available_at")
_HELD = ("token", "reserved_until", "reserved_at")
#: SQLite keeps whatever a column is given: its text columns are read as bytes, as the claim reads them.
_AS_BYTES = ("id", "name", "body")
#: The characters of an unreadable row's body kept in its listing.
_RAW_SHOWN = 4000
#: Priorities of delayed jobs walked one by one, at most; more are sorted together.
_PRIORITY_WALKS = 16
#: Rows read for one id: a collation that ignores case (MariaDB's default) matches ids of another case too.
_SAME_ID = 10


def _order(columns: tuple[str, ...], alias: str) -> str:
    return ", ".join(f"{alias}.{column}" for column in columns)


class Browsing(Claims):
    """``list_jobs`` and ``find_job`` of ``DatabaseQueue``."""

    #: Jobs a name filter looks at per page, at most, from the first of the state (the
    #: page says when it stopped there: :class:`~rainier_sync.drivers.paging.Page`).
    listing_scan: int = 10_000

    def _columns(self, alias: str) -> str:
        """The columns a listed row is read from, as the claim reads a row it claimed."""
        read = [
            f"CAST({alias}.{c} AS BLOB)" if self.dialect == SQLITE and c in _AS_BYTES else f"{alias}.{c}" for c in _READ
        ]
        return ", ".join([*read, *(f"{alias}.{c}" for c in _HELD)])

    def _name_condition(self) -> str:
        """``name`` contains the pattern's text, ignoring case, on every dialect."""
        if self.dialect == POSTGRESQL:
            return f"name ILIKE %s ESCAPE '{LIKE_ESCAPE}'"
        if self.dialect == MYSQL:  # a binary or case-sensitive collation would not ignore case
            return f"LOWER(name) LIKE LOWER(%s) ESCAPE '{LIKE_ESCAPE}'"
        return f"name LIKE %s ESCAPE '{LIKE_ESCAPE}'"  # SQLite: ASCII letters, whatever their case

    def list_jobs(
        self, queue: str, state: JobState, *, name: str | None = None, offset: int = 0, limit: int = 50
    ) -> Page:
        """A page of ``queue``'s jobs in ``state``, by "now" on the Python clock:
        ``ready`` (due, not reserved) in the claim's order (priority, due time,
        then dispatch), ``delayed`` (due later) by due time, ``reserved`` by when
        the reservation lapses (a lapsed one stays reserved until
        ``reclaim_expired`` frees it).

        ``name`` keeps the jobs whose ``NAME`` contains it, ignoring case (``%``
        and ``_`` are plain characters), among the first :attr:`listing_scan` jobs
        of the state: the :class:`~rainier_sync.drivers.paging.Page` returned has
        ``complete`` False when there are more it did not look at.

        A row that cannot be read is listed as far as its columns can be: its
        id, name, attempts, priority and due time, an empty payload, and
        ``job.meta["unreadable"]`` saying why (``meta["raw"]``: the start of what
        it holds). A worker's claim moves it to the failed store.
        """
        state = check_page(state, offset, limit)
        needle = name_filter(name)
        page = Page()
        if limit == 0:
            return page
        now = [_clock.now()] if state in _READS_NOW else []
        # Delayed jobs are due-time ordered within each priority on the claim's index:
        # one ordered walk per priority, merged, rather than a sort of the whole queue.
        priorities = self._priorities(queue) if state == "delayed" else None
        pattern: str | None = None
        edge: list[Any] = []
        if needle is not None:
            # The first job past the bound, if there is one: the filter looks at the jobs before it.
            page.bound = max(1, int(self.listing_scan))
            past = self._backend.query(*self._chosen(state, queue, now, priorities, 1, page.bound))
            edge = list(past[0]) if past else []
            pattern = like_pattern(needle)
        chosen, params = self._chosen(state, queue, now, priorities, int(limit), int(offset), pattern, edge)
        order = _order(_STATES[state][1], "j")
        sql = f"SELECT {self._columns('j')} FROM {JOBS} j JOIN ({chosen}) p ON j.seq = p.seq ORDER BY {order}"
        page.extend(self._listed(row, state) for row in self._backend.query(sql, params))
        page.complete = not edge or len(page) >= limit
        return page

    def _chosen(
        self,
        state: JobState,
        queue: str,
        now: list[float],
        priorities: list[int] | None,
        limit: int,
        offset: int,
        pattern: str | None = None,
        edge: Sequence[Any] = (),
    ) -> tuple[str, list[Any]]:
        """The query choosing a page of the state's jobs (their ordering columns, ``seq``
        among them) on the index, and its parameters: those whose name matches
        ``pattern``, before ``edge`` (ordering values), in one walk per priority of
        ``priorities`` when given."""
        condition, order = _STATES[state]
        columns = ", ".join(order)
        where, extra = condition, list[Any](now)
        if pattern is not None:
            where += f" AND {self._name_condition()}"
            extra.append(pattern)
        if edge:
            before, values = self._before(order, edge)
            where += f" AND {before}"
            extra.extend(values)
        if priorities is None:
            sql = f"SELECT {columns} FROM {JOBS} WHERE queue = %s AND {where} ORDER BY {columns} LIMIT %s OFFSET %s"
            return sql, [queue, *extra, limit, offset]
        branches, params = [], []
        for n, priority in enumerate(priorities):
            branches.append(
                f"SELECT {columns} FROM (SELECT {columns} FROM {JOBS} WHERE queue = %s AND priority = %s AND {where} "
                f"ORDER BY {columns} LIMIT %s) b{n}"
            )
            params += [queue, priority, *extra, limit + offset]
        sql = f"SELECT {columns} FROM ({' UNION ALL '.join(branches)}) u ORDER BY {columns} LIMIT %s OFFSET %s"
        return sql, [*params, limit, offset]

    def _before(self, order: tuple[str, ...], edge: Sequence[Any]) -> tuple[str, list[Any]]:
        """A condition keeping the rows ordered before ``edge``, and its parameters.
        MariaDB walks an index range only for the condition spelled out column by
        column; the others compare the row values."""
        if self.dialect != MYSQL:
            return f"({', '.join(order)}) < ({', '.join(['%s'] * len(order))})", list(edge)
        terms, values = [], []
        for n, column in enumerate(order):
            terms.append(" AND ".join([*(f"{c} = %s" for c in order[:n]), f"{column} < %s"]))
            values += [*edge[:n], edge[n]]
        return "(" + " OR ".join(f"({term})" for term in terms) + ")", values

    def _priorities(self, queue: str) -> list[int] | None:
        """The priorities of ``queue``'s unreserved jobs, lowest first, each found on the
        claim's index; None when there are more than :data:`_PRIORITY_WALKS`."""
        found: list[int] = []
        sql = f"SELECT MIN(priority) FROM {JOBS} WHERE queue = %s AND reserved_at IS NULL"
        while len(found) <= _PRIORITY_WALKS:
            after = " AND priority > %s" if found else ""
            [(lowest,)] = self._backend.query(sql + after, [queue, *found[-1:]])
            if lowest is None:
                return found
            if type(lowest) is not int:  # SQLite holds what it is given: merged walks cannot tell it apart
                return None
            found.append(lowest)
        return None

    def find_job(self, id: str) -> ListedJob | None:
        """The job ``id`` (ready, delayed or reserved), or None. Reads the whole
        jobs table, which has no index on the id (one would cost every dispatch)."""
        now = _clock.now()
        rows = self._backend.query(
            f"SELECT {self._columns(JOBS)} FROM {JOBS} WHERE id = %s ORDER BY seq LIMIT {_SAME_ID}", (id,)
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
