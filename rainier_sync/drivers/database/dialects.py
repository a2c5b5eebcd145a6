"""What differs between SQLite, PostgreSQL and MariaDB/MySQL: placeholders, the
statements whose syntax differs, transactions, and the few behaviours of the
queue that each dialect does its own way (notifications, bulk inserts, claims).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ...types import float_text
from ._schema import CHANNEL, FAILED, JOBS
from .url import MYSQL, POSTGRESQL, SQLITE

if TYPE_CHECKING:
    from ...types import QueuedJob

#: The most a MariaDB/MySQL TEXT column holds, and what marks an error cut to fit it.
_MYSQL_TEXT_BYTES = 65_535
_CUT = " … (cut to fit the error column; the exception holds all of it)".encode()

_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def storable(text: str, *, holds_nul: bool) -> tuple[str, tuple[str, ...]]:
    """``text`` as a text column holds it, and what was escaped: a lone surrogate
    (which no UTF-8 column holds) as its ``\\uXXXX`` escape, and, unless the
    column ``holds_nul`` (PostgreSQL's does not), NUL as ``\\u0000``.

    JSON text so escaped reads back as it was: JSON holds no raw NUL, and a raw
    surrogate can only stand inside a string, where its escape means the same."""
    if text.isascii():
        if holds_nul or "\x00" not in text:
            return text, ()
        return text.replace("\x00", "\\u0000"), ("NUL as \\u0000",)
    escaped: tuple[str, ...] = ()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        escaped = ("a lone surrogate as its \\uXXXX escape",)
    if not holds_nul and "\x00" in text:
        text = text.replace("\x00", "\\u0000")
        escaped += ("NUL as \\u0000",)
    return text, escaped


def _copy_text(value: str) -> str:
    """``value`` as a field of PostgreSQL's COPY text format."""
    return value if value.isalnum() else value.translate(_COPY_ESCAPES)


#: Queue and job names repeat from job to job.
_copy_name = functools.lru_cache(maxsize=1024)(_copy_text)


def job_row(job: QueuedJob) -> tuple[Any, ...]:
    """The values of :meth:`Dialect.insert_job` for ``job``."""
    return (job.id, job.queue, job.name, job.encode(), job.attempts, job.priority, job.available_at)


class Dialect:
    """Placeholders and the statements and behaviours whose form differs by
    dialect. Statements are written with ``%s``; calling the dialect on one
    gives it this dialect's placeholders."""

    name = ""
    ph = "%s"
    #: The claim path used when none is asked for.
    default_claim = "optimistic"
    #: Seconds between looks for new jobs when an idle wait cannot be woken.
    poll_interval = 0.25
    #: Whether idle workers may wait on ``LISTEN/NOTIFY``.
    notifies = False
    #: Whether one statement can claim and return rows (``UPDATE ... RETURNING``).
    returning = True
    #: Whether a text column holds a NUL character.
    holds_nul = True

    def __call__(self, sql: str) -> str:
        return sql

    def marks(self, n: int) -> str:
        return ", ".join([self.ph] * n)

    # -- statements ---------------------------------------------------------------------------
    def insert_job(self) -> str:
        return f"INSERT INTO {JOBS} (id, queue, name, body, attempts, priority, available_at) VALUES ({self.marks(7)})"

    def insert_one(self) -> str:
        """The insert of one job, announcing it where the dialect can."""
        return self.insert_job()

    def upsert_failed(self) -> str:
        return self._insert_failed() + (
            " ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, name = excluded.name, body = excluded.body,"
            " error = excluded.error, exception = excluded.exception, attempts = excluded.attempts,"
            " failed_at = excluded.failed_at"
        )

    def _insert_failed(self) -> str:
        cols = "id, queue, name, body, error, exception, attempts, failed_at"
        return f"INSERT INTO {FAILED} ({cols}) VALUES ({self.marks(8)})"

    def held(self, seqs: list[int], tokens: list[str]) -> tuple[str, list[Any]]:
        """A WHERE clause matching the rows ``seqs`` still claimed with one of ``tokens``."""
        return f"seq IN ({self.marks(len(seqs))}) AND token IN ({self.marks(len(tokens))})", [*seqs, *tokens]

    def by_ids(self, ids: list[str]) -> tuple[str, list[Any]]:
        return f"id IN ({self.marks(len(ids))})", list(ids)

    def notifying(self, update: str, *, distinct: bool = False) -> str:
        """``update`` (of jobs, ready again) telling idle workers elsewhere on commit, where it can."""
        return update

    def error_column(self, error: str) -> str:
        """The error string as the failed store's ``error`` column can hold it."""
        return error

    def storable(self, text: str) -> tuple[str, tuple[str, ...]]:
        """``text`` as this dialect's text columns hold it, and what was escaped (:func:`storable`)."""
        return storable(text, holds_nul=self.holds_nul)

    def data_version(self) -> str:
        """A query whose answer changes when another connection commits new jobs."""
        return f"SELECT max(seq) FROM {JOBS}"

    # -- transactions ---------------------------------------------------------------------------
    def begin(self, conn: Any) -> None:
        conn.execute("BEGIN")

    def commit(self, conn: Any) -> None:
        conn.execute("COMMIT")

    def rollback(self, conn: Any) -> None:
        conn.execute("ROLLBACK")

    # -- bulk inserts ---------------------------------------------------------------------------
    def batches(self, jobs: Sequence[QueuedJob]) -> list[Any]:
        """``jobs`` as :meth:`insert_many` takes them, prepared before its transaction begins."""
        return [[job_row(job) for job in jobs]]

    def insert_many(self, cursor: Any, batches: Iterable[Any]) -> None:
        """Insert the batches in the caller's transaction."""
        insert = self(self.insert_job())
        for rows in batches:
            cursor.executemany(insert, rows)


class SQLite(Dialect):
    name = SQLITE
    ph = "?"
    poll_interval = 0.01

    def __call__(self, sql: str) -> str:
        return sql.replace("%s", "?")

    def data_version(self) -> str:
        return "PRAGMA data_version"

    def begin(self, conn: Any) -> None:
        # Takes the write lock up front: the transaction never has to wait for it halfway.
        conn.execute("BEGIN IMMEDIATE")


class PostgreSQL(Dialect):
    name = POSTGRESQL
    default_claim = "skip_locked"
    notifies = True
    holds_nul = False

    def insert_one(self) -> str:
        # NOTIFY in the same statement: delivered when (and only if) the insert commits.
        return f"WITH ins AS ({self.insert_job()} RETURNING queue) SELECT pg_notify('{CHANNEL}', queue) FROM ins"

    def held(self, seqs: list[int], tokens: list[str]) -> tuple[str, list[Any]]:
        return "seq = ANY(%s) AND token = ANY(%s)", [seqs, tokens]

    def by_ids(self, ids: list[str]) -> tuple[str, list[Any]]:
        return "id = ANY(%s)", [ids]

    def notifying(self, update: str, *, distinct: bool = False) -> str:
        if distinct:
            return (
                f"WITH r AS ({update} RETURNING queue) SELECT pg_notify('{CHANNEL}', q) "
                "FROM (SELECT DISTINCT queue AS q FROM r) AS s"
            )
        return f"WITH r AS ({update} RETURNING queue) SELECT pg_notify('{CHANNEL}', queue) FROM r"

    def batches(self, jobs: Sequence[QueuedJob]) -> list[Any]:
        # Encoded as COPY writes them: the server stores one slice while the next is encoded.
        return [jobs[start : start + 200] for start in range(0, len(jobs), 200)]

    def insert_many(self, cursor: Any, batches: Iterable[Any]) -> None:
        """``COPY`` the jobs in, then notify each queue, in the caller's transaction.

        Each slice goes out as it is written, so the server stores one slice while
        the next is being encoded (or built) here.
        """
        text, name = _copy_text, _copy_name
        queues: set[str] = set()
        with cursor.copy(f"COPY {JOBS} (id, queue, name, body, attempts, priority, available_at) FROM STDIN") as copy:
            for part in batches:
                lines = []
                for job in part:
                    queue = job.queue
                    queues.add(queue)
                    available_at = float(job.available_at)
                    if available_at - available_at:
                        raise ValueError(f"job {job.id}: available_at must be a finite time, got {available_at!r}")
                    # JSON holds no raw tab or line break: only its backslashes need doubling
                    body = job.encode().replace("\\", "\\\\")
                    lines.append(
                        f"{text(job.id)}\t{name(queue)}\t{name(job.name)}\t{body}"
                        f"\t{int(job.attempts)}\t{int(job.priority)}\t{float_text(available_at)}\n"
                    )
                copy.write("".join(lines))
        for queue in sorted(queues):
            cursor.execute("SELECT pg_notify(%s, %s)", (CHANNEL, queue))


class MySQL(Dialect):
    name = MYSQL
    returning = False

    def upsert_failed(self) -> str:
        return self._insert_failed() + (
            " ON DUPLICATE KEY UPDATE queue = VALUES(queue), name = VALUES(name), body = VALUES(body),"
            " error = VALUES(error), exception = VALUES(exception), attempts = VALUES(attempts),"
            " failed_at = VALUES(failed_at)"
        )

    def error_column(self, error: str) -> str:
        # TEXT holds 65,535 bytes and refuses more, which would make every attempt
        # to fail the job raise: a longer message is cut (the exception column keeps it).
        data = error.encode("utf-8")
        if len(data) <= _MYSQL_TEXT_BYTES:
            return error
        return data[: _MYSQL_TEXT_BYTES - len(_CUT)].decode("utf-8", errors="ignore") + _CUT.decode()

    def begin(self, conn: Any) -> None:
        conn.begin()

    def commit(self, conn: Any) -> None:
        conn.commit()

    def rollback(self, conn: Any) -> None:
        conn.rollback()


_DIALECTS: dict[str, Dialect] = {SQLITE: SQLite(), POSTGRESQL: PostgreSQL(), MYSQL: MySQL()}


def dialect_for(name: str) -> Dialect:
    """The dialect named ``name`` (``sqlite``, ``postgresql`` or ``mysql``)."""
    return _DIALECTS[name]
