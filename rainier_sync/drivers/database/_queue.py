"""``DatabaseQueue`` over SQLite, PostgreSQL and MariaDB/MySQL."""

from __future__ import annotations

import functools
import logging
import os
import select
import sqlite3
import threading
import urllib.parse
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence, TypeVar

from ... import _clock
from ...errors import PayloadError
from ...types import ExceptionInfo, FailedJob, QueueCounts, QueuedJob, as_exception_info, decode, encode, float_text
from ..base import BaseQueue, Capabilities, QueueDriver, Waker, as_job_list

if TYPE_CHECKING:
    from ...locks.database import DatabaseLockStore
from ._connection import (
    MYSQL,
    POSTGRESQL,
    SQLITE,
    DatabaseUrl,
    connect,
)
from ._schema import CHANNEL, FAILED, JOBS, MIGRATION_LIST, Migration, migrate
from ._sqlalchemy import dbapi_connection, is_sqlalchemy
from .backend import _Backend

log = logging.getLogger("rainier_sync")

T = TypeVar("T")

_CLAIM_PATHS = ("skip_locked", "optimistic")
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
#: The most a MariaDB/MySQL TEXT column holds, and what marks an error cut to fit it.
_MYSQL_TEXT_BYTES = 65_535
_CUT = " … (cut to fit the error column; the exception holds all of it)".encode()


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: str) -> str:
    """``value`` as a field of PostgreSQL's COPY text format."""
    return value if value.isalnum() else value.translate(_COPY_ESCAPES)


#: Queue and job names repeat from job to job.
_copy_name = functools.lru_cache(maxsize=1024)(_copy_text)


class DatabaseQueue(BaseQueue):
    """Jobs in a table of the application's own database: SQLite (the embedded
    default), PostgreSQL (psycopg 3) or MariaDB/MySQL (PyMySQL).

    Build it with :meth:`from_url`; create its tables with :meth:`migrate`.
    Every time it stores (due times, reservations) comes from the Python clock,
    so ``freezegun`` moves delays and backoff on every dialect.

    The claim is a conditional ``UPDATE ... WHERE reserved_at IS NULL`` over
    several candidates, so two workers never both win a job. On PostgreSQL the
    default claim path locks its candidates with ``FOR UPDATE SKIP LOCKED``
    (one round trip per batch, no waiting on a row another worker holds), and
    idle workers wake on ``LISTEN/NOTIFY``; ``claim="optimistic"`` selects the
    portable path instead.

    On PostgreSQL a worker's claims and acknowledgements go over a connection
    of their own with ``synchronous_commit`` off (``synchronous_commit=True``
    turns it back on): a server crash may forget the last fraction of a second
    of them, so those jobs run again, while a dispatch always waits for its
    commit to be flushed, so an accepted job is never lost.

    Behind a transaction-pooling proxy such as pgbouncer, ``listen=False`` (or
    ``?listen=false`` in the URL) keeps to what such a pool allows: idle
    workers poll every ``poll_interval`` instead of ``LISTEN``, statements are
    never prepared on the server, and no session setting is made (so
    ``synchronous_commit`` stays as the server has it).
    """

    driver = QueueDriver.DATABASE
    capabilities = Capabilities(give_back=True, wakes=True, transactional_dispatch=True, migrations=True)

    def __init__(
        self,
        url: str,
        *,
        reservation: float = 90,
        claim: str | None = None,
        poll_interval: float | None = None,
        reconnect_for: float | None = None,
        response_timeout: float | None = None,
        application_name: str = "rainier_sync",
        synchronous_commit: bool = False,
        listen: bool | None = None,
    ) -> None:
        if isinstance(reservation, bool) or not isinstance(reservation, (int, float)) or reservation <= 0:
            raise ValueError(f"reservation must be a positive number of seconds, got {reservation!r}")
        self.reservation: float = float(reservation)
        target = DatabaseUrl.parse(url)
        if listen is not None:
            if not isinstance(listen, bool):
                raise ValueError(f"listen must be True or False, got {listen!r}")
            target = replace(target, listen=listen)
        #: Whether idle workers wait on ``LISTEN/NOTIFY`` (PostgreSQL) rather than polling.
        self.listen = target.listen
        self.dialect = target.dialect
        if claim is None:
            claim = "skip_locked" if self.dialect == POSTGRESQL else "optimistic"
        if claim not in _CLAIM_PATHS:
            raise ValueError(f"claim must be one of {', '.join(_CLAIM_PATHS)}, got {claim!r}")
        if claim == "skip_locked" and self.dialect != POSTGRESQL:
            raise ValueError(f"claim='skip_locked' needs PostgreSQL; the {self.dialect} database uses 'optimistic'")
        self.claim = claim
        self.capabilities = Capabilities(
            give_back=True,
            wakes=True,
            transactional_dispatch=True,
            migrations=True,
            combined_claim=claim == "skip_locked" or self.dialect == SQLITE,
            streaming_push=self.dialect == POSTGRESQL,
        )
        if poll_interval is None:
            poll_interval = 0.01 if self.dialect == SQLITE else 0.25
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or poll_interval <= 0:
            raise ValueError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        self.poll_interval = float(poll_interval)
        self.url = target.redacted
        self._backend = _Backend(
            target, reconnect_for=reconnect_for, response_timeout=response_timeout, application_name=application_name
        )
        self._consumer: _Backend | None = None if target.dialect == POSTGRESQL else self._backend
        self._consumer_lock = threading.Lock()
        # A session setting would outlive its transaction in a pool and reach other clients.
        self._consumer_init = () if synchronous_commit or not target.listen else ("SET synchronous_commit TO off",)
        self._sql = self._backend.sql
        #: Each idle wait's waker and the queues it waits for.
        self._waiters: dict[Waker, frozenset[str]] = {}
        self._waiters_lock = threading.Lock()
        self._listener: Any = None
        #: Serialises opening the LISTEN connection and reading its notifications:
        #: several workers in one process may wait on this driver at once.
        self._listen_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, reservation: float = 90, **options: Any) -> DatabaseQueue:
        """Connect to ``url`` now: a server that cannot be reached raises
        ``DatabaseUnavailableError`` naming it, one that refuses the connection (no
        such database, wrong password) ``ConfigurationError``. A SQLite file that
        does not exist yet is created by :meth:`migrate` and by nothing else.

        ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (options
        ``?synchronous=NORMAL|FULL`` and ``busy_timeout`` in ms),
        ``postgresql://user@host:port/db`` (libpq options such as
        ``options=-c search_path=jobs`` and ``connect_timeout``), or
        ``mysql://user:password@host:port/db``. Keyword options: ``claim``
        (``"skip_locked"`` or ``"optimistic"``), ``poll_interval``,
        ``reconnect_for`` (seconds to keep reopening a lost connection, 10),
        ``response_timeout`` (seconds to wait for the server's reply, 10) and
        ``listen`` (``False`` behind a transaction-pooling pgbouncer: poll
        instead of ``LISTEN``); those three may also be given in the URL
        (``?reconnect_for=5&response_timeout=30&listen=false``).
        """
        return cls(url, reservation=reservation, **options)

    @property
    def _worker(self) -> _Backend:
        """The connection for claims and acknowledgements (the worker's owning loop)."""
        consumer = self._consumer
        if consumer is None:
            with self._consumer_lock:
                if self._consumer is None:
                    main = self._backend.db
                    self._consumer = _Backend(
                        self._backend.target,
                        reconnect_for=main.reconnect_for,
                        response_timeout=main.response_timeout,
                        application_name=main.application_name,
                        init=self._consumer_init,
                    )
                consumer = self._consumer
        return consumer

    # -- schema --------------------------------------------------------------------------
    @staticmethod
    def migrations() -> list[Migration]:
        """The versioned DDL, for each dialect (``migration.sql("postgresql")``)."""
        return list(MIGRATION_LIST)

    def migrate(self) -> list[int]:
        """Create or upgrade the queue's tables; returns the versions applied now.
        Safe to run again, and from several processes at once."""
        return migrate(self._backend.db)

    def lock_store(self) -> DatabaseLockStore:
        """A lock store on this queue's connection (unique jobs, leases, middleware, paused queues)."""
        from ...locks.database import DatabaseLockStore

        return DatabaseLockStore(_backend=self._backend)

    def describe(self) -> str:
        return f"database ({self.dialect}: {self._backend.target.where})"

    # -- producing -------------------------------------------------------------------------
    def _row(self, job: QueuedJob) -> tuple[Any, ...]:
        return (job.id, job.queue, job.name, job.encode(), job.attempts, job.priority, job.available_at)

    def push(self, job: QueuedJob) -> str:
        self._backend.execute(self._insert_one(), self._row(job))
        self._wake_local()
        return job.id

    def _insert_one(self) -> str:
        insert = self._sql.insert_job()
        if self.dialect != POSTGRESQL:
            return insert
        # NOTIFY in the same statement: delivered when (and only if) the insert commits.
        return f"WITH ins AS ({insert} RETURNING queue) SELECT pg_notify('{CHANNEL}', queue) FROM ins"

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        if not jobs:
            return []
        if self.dialect == POSTGRESQL:
            slices = [jobs[start : start + 200] for start in range(0, len(jobs), 200)]
            self._backend.transaction(lambda cursor: self._copy_in(cursor, slices))
        else:
            rows = [self._row(job) for job in jobs]
            insert = self._sql(self._sql.insert_job())
            self._backend.transaction(lambda cursor: cursor.executemany(insert, rows))
        self._wake_local()
        return [job.id for job in jobs]

    def push_stream(self, slices: Iterator[Sequence[QueuedJob]]) -> None:
        """Store jobs as their slices are built (``dispatch_many``): one ``COPY``
        takes each slice as it comes, so the server stores one while the
        next is built. SQLite and MariaDB have no such path and refuse (see
        ``Capabilities.streaming_push``)."""
        if self.dialect != POSTGRESQL:
            super().push_stream(slices)
        first = next(slices, None)
        if first is None:
            return
        taken: list[Sequence[QueuedJob]] = [first]

        def replayable() -> Iterator[Sequence[QueuedJob]]:
            # A lost connection runs the transaction again: it must see every slice.
            yield from list(taken)
            for part in slices:
                taken.append(part)
                yield part

        self._backend.transaction(lambda cursor: self._copy_in(cursor, replayable()))
        self._wake_local()

    def _copy_in(self, cursor: Any, slices: Iterable[Sequence[QueuedJob]]) -> None:
        """``COPY`` the jobs in (PostgreSQL), then notify each queue, in the caller's transaction.

        Each slice goes out as it is written, so the server stores one slice while
        the next is being encoded (or built) here.
        """
        text, name = _copy_text, _copy_name
        queues: set[str] = set()
        with cursor.copy(f"COPY {JOBS} (id, queue, name, body, attempts, priority, available_at) FROM STDIN") as copy:
            for part in slices:
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

    def push_within(self, connection: Any, jobs: Sequence[QueuedJob]) -> list[str]:
        """Insert ``jobs`` on the caller's open connection, inside its transaction:
        they commit, or roll back, with the caller's own writes.

        ``connection`` is a sqlite3, psycopg 3 or PyMySQL connection, or a
        SQLAlchemy 2 ``Connection`` or ``Session`` (Flask-SQLAlchemy's
        ``db.session`` too) over one of them; a SQLAlchemy one gets its
        transaction begun if it has none yet."""
        described = f"{type(connection).__module__}.{type(connection).__qualname__}"
        if is_sqlalchemy(connection):
            connection, dialect, described = dbapi_connection(connection)
        elif isinstance(connection, sqlite3.Connection):
            dialect = SQLITE
        else:
            module = type(connection).__module__.split(".")[0]
            dialect = {"psycopg": POSTGRESQL, "pymysql": MYSQL}.get(module, "")
        if dialect != self.dialect:
            raise TypeError(
                f"dispatch within a transaction needs an open {self.dialect} connection to the queue's database "
                f"({self._backend.target.where}); got {described}"
            )
        if dialect == SQLITE:
            self._check_same_sqlite_file(connection)
        else:
            self._check_same_database(connection, described)
        cursor = connection.cursor()
        sql = self._sql(self._insert_one())
        for job in jobs:
            try:
                cursor.execute(sql, self._row(job))
            except self._backend._refused as exc:
                text = str(exc).strip()
                raise PayloadError(
                    f"{self._backend.target.label} refused a value of job {job.id!r}: "
                    f"{text.splitlines()[0] if text else exc!r}"
                ) from exc
        return [job.id for job in jobs]

    def _check_same_sqlite_file(self, connection: sqlite3.Connection) -> None:
        rows = connection.execute("PRAGMA database_list").fetchall()
        files = {os.path.realpath(row[2]) for row in rows if row[1] == "main" and row[2]}
        ours = os.path.realpath(self._backend.target.path)
        if files and ours not in files:
            raise TypeError(
                f"dispatch within a transaction: that connection is on the SQLite file {sorted(files)[0]}, "
                f"not on the queue's file {ours}"
            )

    def _check_same_database(self, connection: Any, described: str) -> None:
        """Refuse a connection to another database of the server (or another server's
        database of another name); hosts are not compared, as one may have several names."""
        ours = urllib.parse.unquote(urllib.parse.urlsplit(self._backend.target.url).path.lstrip("/"))
        if self.dialect == POSTGRESQL:
            theirs = connection.info.dbname
        else:
            theirs = connection.db
            theirs = theirs.decode() if isinstance(theirs, bytes) else theirs
        if ours and theirs and theirs != ours:
            raise TypeError(
                f"dispatch within a transaction: {described} is connected to the database {theirs!r}, "
                f"but the queue is in {self._backend.target.label}"
            )

    def _wake_local(self) -> None:
        if self._waiters:
            with self._waiters_lock:
                waiters = list(self._waiters)
            for waker in waiters:
                waker.set()

    # -- consuming -------------------------------------------------------------------------
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self._reserve(queues, limit, ())

    def acknowledge_and_reserve(self, done: Sequence[QueuedJob], queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """On PostgreSQL one statement deletes the finished jobs and claims the next
        batch; on SQLite one transaction does both. Either way it is atomic: when it
        raises, neither happened."""
        combined = self.claim == "skip_locked" or self.dialect == SQLITE
        if not combined or limit <= 0:
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
        token = uuid.uuid4().hex
        sql = (
            f"UPDATE {JOBS} SET reserved_at = ?, reserved_until = ?, token = ?, "
            f"attempts = min(attempts, {_MOST_ATTEMPTS}) + 1 "
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

                if self.dialect == MYSQL:
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
                    log.warning("could not move unreadable job %s to the failed store", _text(row[1]), exc_info=True)
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
        job_id, name, raw = _text(job_id), _text(name), _text(body)
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
            cursor.execute(
                self._sql(self._sql.upsert_failed()),
                (job_id, queue, name, raw, self._error_column(info.error), encode(info.to_dict()), count, _clock.now()),
            )
            moved.append(True)

        self._worker.transaction(move)
        if moved:
            self.announce_discarded(info, raw)

    def _held(self, jobs: Sequence[QueuedJob]) -> tuple[str, list[Any]]:
        """A WHERE clause matching exactly these reservations: the rows claimed
        (``seq``) with their claim tokens. A token is only ever written by the
        claim that made it, so a row another worker claimed since does not match."""
        claimed = [job.receipt for job in jobs if isinstance(job.receipt, tuple)]
        if len(claimed) < len(jobs):  # not from reserve(): by job id (no index; an unusual call)
            ids = [job.id for job in jobs]
            if self.dialect == POSTGRESQL:
                return "id = ANY(%s)", [ids]
            return f"id IN ({self._sql.marks(len(ids))})", ids
        seqs = [seq for seq, _ in claimed]
        tokens = sorted({token for _, token in claimed})
        if self.dialect == POSTGRESQL:
            return "seq = ANY(%s) AND token = ANY(%s)", [seqs, tokens]
        marks, token_marks = self._sql.marks(len(seqs)), self._sql.marks(len(tokens))
        return f"seq IN ({marks}) AND token IN ({token_marks})", [*seqs, *tokens]

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        if not jobs:
            return
        for start in range(0, len(jobs), 500):
            where, params = self._held(jobs[start : start + 500])
            self._worker.execute(f"DELETE FROM {JOBS} WHERE {where}", params)

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
            if self.dialect == POSTGRESQL:
                update = (
                    f"WITH r AS ({update} RETURNING queue) SELECT pg_notify('{CHANNEL}', q) "
                    "FROM (SELECT DISTINCT queue AS q FROM r) AS s"
                )
            statements.append((self._sql(update), params))

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
        if self.dialect == POSTGRESQL:
            # Idle workers in other processes looked for the soonest job while this
            # one was reserved: tell them, on commit, so they wake when it is due.
            update = f"WITH r AS ({update} RETURNING queue) SELECT pg_notify('{CHANNEL}', queue) FROM r"
        self._worker.stamped(update, lambda: [_clock.now() + delay, *params], fetch=self.dialect == POSTGRESQL)
        self._wake_local()  # a delayed one too: a waiting worker then sleeps until it is due

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        info = as_exception_info(error)
        stored = replace_connection(job, self.connection)
        when: list[float] = []
        where, params = self._held([job])
        if isinstance(job.receipt, tuple):
            # Ours, or lapsed and reclaimed but not claimed again: the attempt that
            # just failed was its last, so it leaves the jobs table either way.
            where = "seq = %s AND (token = %s OR reserved_at IS NULL)"
            params = list(job.receipt)

        def move(cursor: Any) -> None:
            when[:] = [_clock.now()]
            cursor.execute(self._sql(f"DELETE FROM {JOBS} WHERE {where}"), tuple(params))
            if cursor.rowcount == 0:
                # Another worker claimed it again after our reservation lapsed (or it
                # is gone): its run decides; a failed copy here would let a retry
                # queue the job twice.
                return
            cursor.execute(
                self._sql(self._sql.upsert_failed()),
                (
                    job.id,
                    job.queue,
                    job.name,
                    stored.encode(),
                    self._error_column(info.error),
                    encode(info.to_dict()),
                    job.attempts,
                    when[0],
                ),
            )

        self._worker.transaction(move)
        return FailedJob.of(stored, info, when[0])

    def _error_column(self, error: str) -> str:
        """The error string as the failed store's ``error`` column can hold it.

        MariaDB/MySQL's ``TEXT`` holds 65,535 bytes and refuses more, which would
        make every attempt to fail the job raise, so a longer message is cut there
        (the whole one stays in the ``exception`` column).
        """
        if self.dialect != MYSQL:
            return error
        data = error.encode("utf-8")
        if len(data) <= _MYSQL_TEXT_BYTES:
            return error
        return data[: _MYSQL_TEXT_BYTES - len(_CUT)].decode("utf-8", errors="ignore") + _CUT.decode()

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
            if self.dialect == POSTGRESQL:
                self._worker.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            self._wake_local()
        return reclaimed

    # -- the failed store ---------------------------------------------------------------------
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
            id=_text(job_id),
            name=_text(name),
            queue=_text(queue),
            connection=self.connection,
            payload=job.payload if job is not None else {},
            error=_text(error),
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
        sql = self._sql

        def move(cursor: Any) -> bool:
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
            cursor.execute(sql(self._insert_one()), (id, queue, name, body, 0, priority, now))
            return True

        retried = self._backend.transaction(move)
        if retried:
            self._wake_local()
        return retried

    def forget_failed(self, id: str) -> bool:
        return self._backend.execute(f"DELETE FROM {FAILED} WHERE id = %s", (id,)) > 0

    # -- inspection ------------------------------------------------------------------------------
    def size(self, queue: str | None = None) -> int:
        if queue is None:
            return int(self._backend.query(f"SELECT count(*) FROM {JOBS}")[0][0])
        return int(self._backend.query(f"SELECT count(*) FROM {JOBS} WHERE queue = %s", (queue,))[0][0])

    def counts(self, queue: str) -> QueueCounts:
        row = self._backend.query(
            "SELECT count(*), "
            "COALESCE(SUM(CASE WHEN reserved_at IS NOT NULL THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(CASE WHEN reserved_at IS NULL AND available_at > %s THEN 1 ELSE 0 END), 0) "
            f"FROM {JOBS} WHERE queue = %s",
            lambda: (_clock.now(), queue),
        )[0]
        total, reserved, delayed = (int(v) for v in row)
        return QueueCounts(ready=total - reserved - delayed, delayed=delayed, reserved=reserved)

    def queue_names(self) -> list[str]:
        rows = self._backend.query(f"SELECT DISTINCT queue FROM {JOBS} UNION SELECT DISTINCT queue FROM {FAILED}")
        return sorted(str(row[0]) for row in rows)

    # -- waiting -----------------------------------------------------------------------------
    def _soonest(self, queues: Sequence[str]) -> float | None:
        marks = self._sql.marks(len(queues))
        rows = self._worker.query(
            f"SELECT min(available_at) FROM {JOBS} WHERE queue IN ({marks}) AND reserved_at IS NULL", list(queues)
        )
        soonest = rows[0][0] if rows else None
        if soonest is None:
            return None
        if type(soonest) is not float and type(soonest) is not int:
            return _clock.now()  # a due time SQLite holds as text: the claim takes the row now and moves it
        return float(soonest)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Sleep until a job may be due: a PostgreSQL ``NOTIFY`` from an insert, a
        commit by another SQLite connection, a push in this process, the soonest
        delayed job coming due, or ``waker``."""
        # Start listening (or note SQLite's data version) before looking for the
        # soonest job, so a dispatch between the two is seen by one or the other.
        with self._waiters_lock:
            self._waiters[waker] = frozenset(queues)
        try:
            listener = version = None
            if self.dialect == POSTGRESQL and self.listen:
                listener = self._listen()
            else:
                version = self._data_version()
            soonest = self._soonest(queues) if queues else None
            if soonest is not None:
                timeout = min(timeout, max(0.0, soonest - _clock.now()))
            if timeout <= 0 or waker.is_set():
                return
            if listener is not None:
                self._wait_notified(listener, queues, timeout, waker)
            else:
                self._wait_polling(version, timeout, waker)
        finally:
            with self._waiters_lock:
                self._waiters.pop(waker, None)

    def _listen(self) -> Any:
        with self._listen_lock:
            if self._listener is None or self._listener.closed:
                main = self._backend.db
                conn = connect(
                    self._backend.target,
                    application_name=main.application_name + "-listen",
                    response_timeout=main.response_timeout,
                )
                conn.execute(f"LISTEN {CHANNEL}")
                self._listener = conn
            return self._listener

    def _wait_notified(self, listener: Any, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        lost = self._backend.db._lost
        deadline = _clock.monotonic() + timeout
        try:
            while True:
                remaining = deadline - _clock.monotonic()
                if remaining <= 0 or waker.is_set():
                    return
                readable, _, _ = select.select([listener.fileno(), waker.fileno()], [], [], remaining)
                if waker.is_set():
                    return
                if readable:
                    # One thread reads the notifications and wakes every wait they
                    # concern, its own or another worker's on this driver.
                    with self._listen_lock:
                        # libpq's own calls: never block, on every psycopg 3 release.
                        pgconn = listener.pgconn
                        pgconn.consume_input()
                        payloads = set()
                        while (note := pgconn.notifies()) is not None:
                            payloads.add(note.extra.decode())
                    if payloads:
                        self._wake_waiting_on(payloads)
        except lost as exc:
            log.warning("the LISTEN connection to %s was lost (%s); it reopens on the next wait", self.url, exc)
            self._close_listener(listener)
        except (OSError, ValueError):  # the waker was closed under us: a stop
            return

    def _wait_polling(self, version: Any, timeout: float, waker: Waker) -> None:
        deadline = _clock.monotonic() + timeout
        while True:
            remaining = deadline - _clock.monotonic()
            if remaining <= 0:
                return
            if waker.wait(min(self.poll_interval, remaining)):
                return
            if self._data_version() != version:
                return

    def _data_version(self) -> Any:
        """Changes when another connection commits (SQLite); None where it cannot tell."""
        if self.dialect == SQLITE:
            return self._worker.query("PRAGMA data_version")[0][0]
        rows = self._worker.query(f"SELECT max(seq) FROM {JOBS}")
        return rows[0][0] if rows else None

    def _wake_waiting_on(self, payloads: set[str]) -> None:
        """Wake the waits for any of these queues (an empty payload wakes every wait)."""
        with self._waiters_lock:
            wake = [w for w, queues in self._waiters.items() if "" in payloads or not payloads.isdisjoint(queues)]
        for waker in wake:
            waker.set()

    def _close_listener(self, only: Any = None) -> None:
        """Close the LISTEN connection (``only``: if it is still that one, not a newer one)."""
        with self._listen_lock:
            if only is not None and self._listener is not only:
                return
            listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def close(self) -> None:
        self._close_listener()
        if self._consumer is not None and self._consumer is not self._backend:
            self._consumer.db.close()
        self._backend.db.close()


def _claim_order(job: QueuedJob) -> tuple[int, float, int]:
    return (job.priority, job.available_at, job.receipt[0])


def _text(value: Any) -> str:
    """A column as text for the failed store, whatever the row held."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    return str(value)


def replace_connection(job: QueuedJob, connection: str) -> QueuedJob:
    from dataclasses import replace

    return replace(job, connection=connection, receipt=None)
