"""``DatabaseQueue`` over SQLite, PostgreSQL and MariaDB/MySQL: the producer
side and inspection here, the rest composed from :mod:`.claims` (the consumer
side), :mod:`.failed` (the failed store), :mod:`.listen` (idle waits) and
:mod:`.browse` (listing the jobs stored)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from ... import _clock
from ...errors import PayloadError
from ...types import QueueCounts, QueuedJob
from ..extensions import StreamsPush
from ._schema import FAILED, JOBS, MIGRATION_LIST, Migration, migrate
from .browse import Browsing
from .caller import caller_connection
from .caller_locks import give_back_within, same_database, take_within
from .claims import Claims
from .dialects import job_row
from .failed import FailedTable
from .listen import Waiting
from .store import DatabaseLockStore
from .url import POSTGRESQL

if TYPE_CHECKING:
    from ..base import Binding


class DatabaseQueue(Browsing, Claims, FailedTable, Waiting):
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
        return DatabaseLockStore(_backend=self._backend)

    def describe(self) -> str:
        return f"database ({self.dialect}: {self._backend.target.where})"

    # -- producing -------------------------------------------------------------------------
    def push(self, job: QueuedJob) -> str:
        try:
            self._backend.execute(self._sql.insert_one(), job_row(job))
        except PayloadError as exc:
            raise self._named(exc, [job]) from exc.__cause__
        self._wake_local()
        return job.id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        if not jobs:
            return []
        batches = self._sql.batches(jobs)
        try:
            self._backend.transaction(lambda cursor: self._copy_in(cursor, batches))
        except PayloadError as exc:
            raise self._named(exc, jobs) from exc.__cause__
        self._wake_local()
        return [job.id for job in jobs]

    def _named(self, exc: PayloadError, jobs: Iterable[QueuedJob]) -> PayloadError:
        """A refused push, naming the job and the column whose NUL PostgreSQL text
        cannot hold (a payload may hold one: its JSON writes it ``\\u0000``)."""
        if self._sql.holds_nul:
            return exc
        for job in jobs:
            for column, value in (("id", job.id), ("queue", job.queue), ("name", job.name)):
                if isinstance(value, str) and "\x00" in value:
                    return PayloadError(
                        f"{self._backend.target.label} refused a value of job {job.id!r}: its {column} "
                        f"{value!r} holds a NUL character, which PostgreSQL text cannot hold"
                    )
        return exc

    def push_stream(self, slices: Iterator[Sequence[QueuedJob]]) -> None:
        """Store jobs as their slices are built (``dispatch_many``): one ``COPY``
        takes each slice as it comes, so the server stores one while the
        next is built. SQLite and MariaDB have no such path and refuse (see
        ``Capabilities.streaming_push``)."""
        if self.dialect != POSTGRESQL:
            StreamsPush.refuse(self, "push_stream")
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

        try:
            self._backend.transaction(lambda cursor: self._copy_in(cursor, replayable()))
        except PayloadError as exc:
            raise self._named(exc, (job for part in taken for job in part)) from exc.__cause__
        self._wake_local()

    def _copy_in(self, cursor: Any, batches: Iterable[Any]) -> None:
        """Store the batches in the caller's transaction: slices of jobs through one
        ``COPY`` on PostgreSQL, rows through ``executemany`` elsewhere."""
        self._sql.insert_many(cursor, batches)

    def push_within(self, connection: Any, jobs: Sequence[QueuedJob]) -> list[str]:
        """Insert ``jobs`` on the caller's open connection, inside its transaction:
        they commit, or roll back, with the caller's own writes.

        ``connection`` is a sqlite3, psycopg 3 or PyMySQL connection, or a
        SQLAlchemy 2 ``Connection`` or ``Session`` (Flask-SQLAlchemy's
        ``db.session`` too) over one of them; a SQLAlchemy one gets its
        transaction begun if it has none yet."""
        connection, _ = caller_connection(connection, self._backend.target, "the queue")
        cursor = connection.cursor()
        sql = self._sql(self._sql.insert_one())
        for job in jobs:
            try:
                cursor.execute(sql, job_row(job))
            except self._backend._refused as exc:
                text = str(exc).strip()
                refused = PayloadError(
                    f"{self._backend.target.label} refused a value of job {job.id!r}: "
                    f"{text.splitlines()[0] if text else exc!r}"
                )
                raise self._named(refused, [job]) from exc
        return [job.id for job in jobs]

    def bind(self, manager: Binding, connection: str) -> None:
        super().bind(manager, connection)
        self._binding = manager

    def lock_within(self, connection: Any, wanted: Sequence[tuple[str, str, float]]) -> list[bool] | None:
        """In the caller's transaction, when the manager's lock store is a
        :class:`~rainier_sync.locks.DatabaseLockStore` on this queue's database
        (see :mod:`.caller_locks`); None otherwise."""
        binding = getattr(self, "_binding", None)
        locks = binding.locks if binding is not None else None
        if not isinstance(locks, DatabaseLockStore) or not same_database(locks._backend.target, self._backend.target):
            return None
        conn, dialect = caller_connection(connection, self._backend.target, "the queue")
        return take_within(conn, dialect, wanted)

    def unlock_within(self, connection: Any, held: Sequence[tuple[str, str]]) -> None:
        conn, dialect = caller_connection(connection, self._backend.target, "the queue")
        give_back_within(conn, dialect, held)

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

    def close(self) -> None:
        self._close_listener()
        if self._consumer is not None and self._consumer is not self._backend:
            self._consumer.db.close()
        self._backend.db.close()
