"""The outbox table: jobs for connections that cannot write in the caller's
transaction (Redis, SQS, Kafka), written there in it, and the statements a
relay takes them out with."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any, Callable, Iterable, Sequence

from .. import _clock
from ..drivers.database._connection import MYSQL, POSTGRESQL, SQLITE, DatabaseUrl, data_errors
from ..drivers.database._schema import OUTBOX, OUTBOX_CHANNEL, migrate
from ..drivers.database.backend import _Backend
from ..drivers.database.caller import caller_connection
from ..drivers.database.dialects import dialect_for
from ..errors import PayloadError, SchemaMissingError
from ..types import QueuedJob

__all__ = ["Outbox", "Row", "Publish"]

#: One row as a relay reads it: its ``seq``, the connection it is for, the job's envelope.
Row = tuple[int, str, str]
#: What a relay does with the rows it took: the ``seq`` of each row published (or
#: dropped as a duplicate), and why each row its connection refused was refused.
Publish = Callable[[list[Row]], tuple[list[int], dict[int, str]]]


class Outbox:
    """A table in the application's own database where a dispatch
    ``.within(conn)`` to a connection that cannot write in the caller's
    transaction (Redis, SQS, Kafka) puts its job, in that transaction: the job
    exists once the transaction commits, and not at all if it rolls back. A
    relay (:class:`~rainier_sync.outbox.Relay`: ``WorkerOptions(relay=True)``
    or ``rainier-sync outbox:relay``) then publishes the committed rows to
    their connections, in order, and deletes them.

    ``url`` is the database's URL (``sqlite:///…``, ``postgresql://…``,
    ``mysql://…``, the SQLAlchemy spellings too); the caller's connection
    must be on that database. ``connections`` names the connections it takes
    jobs for (None: every connection that needs it). ``lease`` is how long a
    relay on SQLite holds the rows it claimed before another relay may take
    them (PostgreSQL and MariaDB lock them instead, for as long as the
    relay's transaction lasts). Nothing is opened until a relay or
    :meth:`migrate` needs a connection: a process that only dispatches writes
    through its callers' connections.
    """

    def __init__(
        self,
        url: str,
        *,
        connections: Iterable[str] | None = None,
        lease: float = 30.0,
        reconnect_for: float | None = None,
        response_timeout: float | None = None,
    ) -> None:
        self.target = DatabaseUrl.parse(url)
        self.dialect = self.target.dialect
        self.url = self.target.redacted
        if isinstance(connections, str):
            connections = [connections]
        self.connections = frozenset(connections) if connections is not None else None
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not lease > 0:
            raise ValueError(f"outbox lease must be a positive number of seconds, got {lease!r}")
        self.lease = float(lease)
        self._options = {"reconnect_for": reconnect_for, "response_timeout": response_timeout}
        self._sql = dialect_for(self.dialect)
        self._insert = self._sql(f"INSERT INTO {OUTBOX} (connection, body) VALUES (%s, %s)")
        if self.dialect == POSTGRESQL and self.target.listen:
            # The NOTIFY rides in the caller's transaction: a relay hears of the job when it commits.
            self._insert = f"WITH ins AS ({self._insert} RETURNING 1) SELECT pg_notify('{OUTBOX_CHANNEL}', '') FROM ins"
        self._backend_lock = threading.Lock()
        self._opened: _Backend | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Outbox:
        """An outbox in the database at ``url`` (see the class for ``options``)."""
        return cls(url, **options)

    def covers(self, connection: str) -> bool:
        """Whether a dispatch within a transaction to ``connection`` comes here."""
        return self.connections is None or connection in self.connections

    def describe(self) -> str:
        return f"the outbox in {self.target.label}"

    @property
    def listens(self) -> bool:
        """Whether a relay waits on ``LISTEN`` (PostgreSQL, not behind a pooler) rather than polling."""
        return self.dialect == POSTGRESQL and self.target.listen

    # -- dispatching -----------------------------------------------------------------------------
    def write(self, within: Any, connection: str, jobs: Sequence[QueuedJob]) -> list[str]:
        """Insert ``jobs`` for ``connection`` on the caller's open connection
        ``within``, in its transaction (nothing is committed here)."""
        conn, _ = caller_connection(within, self.target, "the outbox")
        if not jobs:
            return []
        cursor = conn.cursor()
        for job in jobs:
            try:
                cursor.execute(self._insert, (connection, job.encode()))
            except Exception as exc:
                if isinstance(exc, data_errors(self.dialect)):
                    text = str(exc).strip()
                    raise PayloadError(
                        f"{self.target.label} refused job {job.id!r} for the outbox: "
                        f"{text.splitlines()[0] if text else exc!r}"
                    ) from exc
                if _missing_table(exc):
                    raise self._missing() from exc
                raise
        return [job.id for job in jobs]

    # -- the relay's side ------------------------------------------------------------------------
    @property
    def backend(self) -> _Backend:
        """The outbox's own connection (the relay's and the migrations'), opened on first use."""
        opened = self._opened
        if opened is None:
            with self._backend_lock:
                if self._opened is None:
                    # No gap locks on MariaDB: a relay's locked read must not hold up the inserts behind it.
                    init = ("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",) if self.dialect == MYSQL else ()
                    self._opened = _Backend(
                        self.target, application_name="rainier_sync-outbox", init=init, **self._options
                    )
                opened = self._opened
        return opened

    def migrate(self) -> list[int]:
        """Create the outbox table (the queue's migrations, version 5 and what comes
        before it); returns the versions applied now."""
        return migrate(self.backend.db)

    def relay_batch(self, limit: int, connections: Sequence[str], publish: Publish) -> int:
        """Take up to ``limit`` committed rows for ``connections``, oldest first, that
        no other relay holds; ``publish`` them; delete those it published and set
        aside those it says were refused. Rows it did neither go back. Returns how
        many rows were taken."""
        if not connections or limit < 1:
            return 0
        try:
            if self.dialect == SQLITE:
                return self._claimed_batch(limit, connections, publish)
            return self.backend.run(lambda conn: self._locked_batch(conn, limit, connections, publish))
        except SchemaMissingError as exc:
            raise self._missing() from exc

    def _locked_batch(self, conn: Any, limit: int, connections: Sequence[str], publish: Publish) -> int:
        """PostgreSQL and MariaDB: the rows stay locked (``SKIP LOCKED`` for the others)
        while they are published; a relay that dies lets go of them with its connection."""
        sql = self._sql
        if self.dialect == POSTGRESQL:
            # An index scan, whatever the statistics say: a queue table's dead rows (deleted,
            # not yet vacuumed) make a sequential scan read every one of them on every batch.
            # And no wait for the delete to reach the disk: a crash that forgets it only
            # publishes those jobs again, as a relay that died would.
            conn.execute("BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL synchronous_commit = off")
        else:
            sql.begin(conn)
        try:
            cursor = conn.cursor()
            params: list[Any] = [list(connections)] if self.dialect == POSTGRESQL else list(connections)
            where = (
                "connection = ANY(%s)" if self.dialect == POSTGRESQL else f"connection IN ({sql.marks(len(params))})"
            )
            cursor.execute(
                f"SELECT seq, connection, body FROM {OUTBOX} WHERE error IS NULL AND {where} "
                "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED",
                (*params, limit),
            )
            rows: list[Row] = [(int(seq), str(name), _text(body)) for seq, name, body in cursor.fetchall()]
            if rows:
                done, refused = publish(rows)
                if done:
                    if self.dialect == POSTGRESQL:
                        cursor.execute(f"DELETE FROM {OUTBOX} WHERE seq = ANY(%s)", (done,))
                    else:
                        # One key at a time, from the list: a scan (what MariaDB picks for `seq IN
                        # (...)` on a small table) would wait on rows other relays and callers hold.
                        cursor.execute(
                            "DELETE o FROM JSON_TABLE(%s, '$[*]' COLUMNS (s BIGINT PATH '$')) AS d "
                            f"STRAIGHT_JOIN {OUTBOX} o ON o.seq = d.s",
                            (json.dumps(done),),
                        )
                if refused:
                    cursor.executemany(
                        f"UPDATE {OUTBOX} SET error = %s WHERE seq = %s", [(why, seq) for seq, why in refused.items()]
                    )
        except BaseException:
            try:
                sql.rollback(conn)
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                pass
            raise
        sql.commit(conn)
        return len(rows)

    def _claimed_batch(self, limit: int, connections: Sequence[str], publish: Publish) -> int:
        """SQLite: claimed with a token for ``lease`` seconds (the write lock is held
        only to claim and to delete, never while publishing)."""
        token = uuid.uuid4().hex
        marks = self._sql.marks(len(connections))

        def claim() -> tuple[Any, ...]:
            now = _clock.now()
            return (token, now + self.lease, *connections, now, limit)

        found = self.backend.stamped(
            f"UPDATE {OUTBOX} SET claim = %s, claimed_until = %s WHERE seq IN (SELECT seq FROM {OUTBOX} "
            f"WHERE error IS NULL AND connection IN ({marks}) AND (claimed_until IS NULL OR claimed_until <= %s) "
            "ORDER BY seq LIMIT %s) RETURNING seq, connection, body",
            claim,
            fetch=True,
        )
        rows: list[Row] = sorted((int(seq), str(name), _text(body)) for seq, name, body in found)
        if not rows:
            return 0
        done: list[int] = []
        refused: dict[int, str] = {}
        try:
            done, refused = publish(rows)
        finally:
            published = set(done)
            left = [seq for seq, _, _ in rows if seq not in refused and seq not in published]

            def settle(cursor: Any) -> None:
                q = self._sql
                if done:
                    cursor.execute(
                        q(f"DELETE FROM {OUTBOX} WHERE claim = %s AND seq IN ({q.marks(len(done))})"), (token, *done)
                    )
                if refused:
                    cursor.executemany(
                        q(f"UPDATE {OUTBOX} SET error = %s, claim = NULL, claimed_until = NULL WHERE seq = %s"),
                        [(why, seq) for seq, why in refused.items()],
                    )
                if left:  # back at once, for the next pass (or another relay)
                    cursor.execute(
                        q(
                            f"UPDATE {OUTBOX} SET claim = NULL, claimed_until = NULL "
                            f"WHERE claim = %s AND seq IN ({q.marks(len(left))})"
                        ),
                        (token, *left),
                    )

            self.backend.transaction(settle)
        return len(rows)

    # -- looking in ------------------------------------------------------------------------------
    def size(self, connection: str | None = None) -> int:
        """Rows waiting to be relayed (refused ones not counted)."""
        try:
            if connection is None:
                rows = self.backend.query(f"SELECT count(*) FROM {OUTBOX} WHERE error IS NULL")
            else:
                rows = self.backend.query(
                    f"SELECT count(*) FROM {OUTBOX} WHERE error IS NULL AND connection = %s", (connection,)
                )
        except SchemaMissingError as exc:
            raise self._missing() from exc
        return int(rows[0][0])

    def waiting_by_connection(self) -> dict[str, int]:
        """Rows waiting, per connection."""
        rows = self.backend.query(f"SELECT connection, count(*) FROM {OUTBOX} WHERE error IS NULL GROUP BY connection")
        return {str(name): int(n) for name, n in rows}

    def refused(self, limit: int = 50) -> list[tuple[int, str, str, str]]:
        """Rows a connection refused, oldest first: ``(seq, connection, envelope, error)``.
        They stay until deleted (by hand: they are rows of the outbox table)."""
        rows = self.backend.query(
            f"SELECT seq, connection, body, error FROM {OUTBOX} WHERE error IS NOT NULL ORDER BY seq LIMIT %s",
            (limit,),
        )
        return [(int(seq), str(name), _text(body), str(error)) for seq, name, body, error in rows]

    def _missing(self) -> SchemaMissingError:
        return SchemaMissingError(
            f"the outbox table is missing from {self.target.label}: run Outbox.migrate() "
            "(or `rainier-sync queue:migrate`) first"
        )

    def close(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            opened.db.close()

    def __repr__(self) -> str:
        return f"<Outbox {self.url}>"


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return str(value)


def _missing_table(exc: BaseException) -> bool:
    text = str(exc)
    return OUTBOX in text and ("no such table" in text or "does not exist" in text or "1146" in repr(exc.args[:1]))
