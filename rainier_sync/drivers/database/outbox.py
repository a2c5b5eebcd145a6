"""The outbox table: jobs for connections that cannot write in the caller's
transaction (Redis, SQS, Kafka), written there in it, and the statements a
relay takes them out with."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from ... import _clock
from ..._checks import check_number
from ...errors import PayloadError, SchemaMissingError
from ...types import QueuedJob
from ._connection import MYSQL, POSTGRESQL, SQLITE, DatabaseUrl, connect, data_errors
from ._schema import OUTBOX, OUTBOX_CHANNEL, migrate
from .backend import _Backend
from .caller import caller_connection
from .dialects import dialect_for

__all__ = ["Outbox", "Row", "Hold", "Publish", "Refused"]

log = logging.getLogger("rainier_sync")

#: One row as a relay reads it: its ``seq``, the connection it is for, the job's envelope.
Row = tuple[int, str, str]
#: Renews the relay's hold on some of the rows it took, before it pushes them;
#: returns those it still holds (on SQLite a claim can lapse and be taken over).
Hold = Callable[[Sequence[int]], set[int]]
#: What a relay does with the rows it took (and the way to renew its hold on
#: them): the ``seq`` of each row published (or dropped as a duplicate), and why
#: each row its connection refused was refused.
Publish = Callable[[list[Row], Hold], tuple[list[int], dict[int, str]]]


class Refused(NamedTuple):
    """A row set aside because its connection refused its job: its ``seq``, the
    ``connection`` it is for, the job's envelope (``body``) and the ``error``."""

    seq: int
    connection: str
    body: str
    error: str

    @property
    def job(self) -> dict[str, Any]:
        """The envelope's fields (``id``, ``name``, ``queue``...); empty when it cannot be read."""
        try:
            found = json.loads(self.body)
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}


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
        self.lease = float(check_number("outbox lease", lease, unit="seconds"))
        self._options = {"reconnect_for": reconnect_for, "response_timeout": response_timeout}
        self._sql = dialect_for(self.dialect)
        self._insert = self._sql(f"INSERT INTO {OUTBOX} (connection, body) VALUES (%s, %s)")
        if self.dialect == POSTGRESQL and self.target.listen:
            # The NOTIFY rides in the caller's transaction: a relay hears of the job when it commits.
            self._insert = f"WITH ins AS ({self._insert} RETURNING 1) SELECT pg_notify('{OUTBOX_CHANNEL}', '') FROM ins"
        self._backend_lock = threading.Lock()
        self._opened: _Backend | None = None
        self._renewing: _Keeper | None = None

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

    def open_listener(self) -> Any:
        r"""A new connection of its own that ``LISTEN``\ s for rows written here
        (where :attr:`listens`): a relay's wake-ups. Closed again when the
        ``LISTEN`` fails."""
        conn = connect(self.target, application_name="rainier_sync-relay-listen")
        try:
            conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
        except Exception:
            conn.close()
            raise
        return conn

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
                done, refused = publish(rows, set)  # locked until this transaction ends
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
        """SQLite: claimed with a token for ``lease`` seconds, renewed while the rows
        are published and before each push (the write lock is held only to claim,
        renew and settle, never while publishing)."""
        token = uuid.uuid4().hex
        marks = self._sql.marks(len(connections))

        def claim() -> tuple[Any, ...]:
            now = _clock.now()
            return (token, now + self.lease, *connections, now, limit)

        claimed_at = _clock.monotonic()
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
        held = _Claim(token, {seq for seq, _, _ in rows}, claimed_at)
        keeper = self._keeper()
        done: list[int] = []
        refused: dict[int, str] = {}
        keeper.add(held)
        try:
            done, refused = publish(rows, lambda seqs: keeper.hold(held, seqs))
        finally:
            keeper.remove(held)
            published = set(done)
            left = [seq for seq, _, _ in rows if seq not in refused and seq not in published]

            def settle(cursor: Any) -> None:
                # Every statement names the claim: rows another relay took over are its to settle.
                q = self._sql
                if done:
                    cursor.execute(
                        q(f"DELETE FROM {OUTBOX} WHERE claim = %s AND seq IN ({q.marks(len(done))})"), (token, *done)
                    )
                if refused:
                    cursor.executemany(
                        q(
                            f"UPDATE {OUTBOX} SET error = %s, claim = NULL, claimed_until = NULL "
                            "WHERE claim = %s AND seq = %s"
                        ),
                        [(why, token, seq) for seq, why in refused.items()],
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
        if connection is None:
            rows = self._read(f"SELECT count(*) FROM {OUTBOX} WHERE error IS NULL")
        else:
            rows = self._read(f"SELECT count(*) FROM {OUTBOX} WHERE error IS NULL AND connection = %s", (connection,))
        return int(rows[0][0])

    def waiting_by_connection(self) -> dict[str, int]:
        """Rows waiting, per connection."""
        rows = self._read(f"SELECT connection, count(*) FROM {OUTBOX} WHERE error IS NULL GROUP BY connection")
        return {str(name): int(n) for name, n in rows}

    def refused(self, limit: int = 50) -> list[Refused]:
        """Rows set aside because their connection refused their job, oldest first
        (:class:`Refused`: ``seq``, ``connection``, ``body``, ``error``). They stay
        until :meth:`retry_refused` puts them back or :meth:`forget_refused` deletes them."""
        rows = self._read(
            f"SELECT seq, connection, body, error FROM {OUTBOX} WHERE error IS NOT NULL ORDER BY seq LIMIT %s",
            (limit,),
        )
        return [Refused(int(seq), str(name), _text(body), str(error)) for seq, name, body, error in rows]

    def refused_by_connection(self) -> dict[str, int]:
        """Rows set aside, per connection."""
        rows = self._read(f"SELECT connection, count(*) FROM {OUTBOX} WHERE error IS NOT NULL GROUP BY connection")
        return {str(name): int(n) for name, n in rows}

    def refused_count(self) -> int:
        """Rows set aside."""
        return int(self._read(f"SELECT count(*) FROM {OUTBOX} WHERE error IS NOT NULL")[0][0])

    def retry_refused(self, seq: int | None = None) -> int:
        """Put a set-aside row (``seq``; None: every one) back in line for the relay,
        in its old place (oldest first); returns how many. For a job its connection
        could not take then (a queue it did not know yet, a limit since raised)."""
        where, params = ("", ()) if seq is None else (" AND seq = %s", (seq,))
        return self._write(
            f"UPDATE {OUTBOX} SET error = NULL"
            + (", claim = NULL, claimed_until = NULL" if self.dialect == SQLITE else "")
            + f" WHERE error IS NOT NULL{where}",
            params,
        )

    def forget_refused(self, seq: int) -> bool:
        """Delete a set-aside row (its job is given up); False when no row ``seq`` is set aside."""
        return self._write(f"DELETE FROM {OUTBOX} WHERE error IS NOT NULL AND seq = %s", (seq,)) > 0

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.backend.query(sql, params)
        except SchemaMissingError as exc:
            raise self._missing() from exc

    def _write(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            return self.backend.execute(sql, params)
        except SchemaMissingError as exc:
            raise self._missing() from exc

    def _missing(self) -> SchemaMissingError:
        return SchemaMissingError(
            f"the outbox table is missing from {self.target.label}: run Outbox.migrate() "
            "(or `rainier-sync queue:migrate`) first"
        )

    def _keeper(self) -> _Keeper:
        """The thread that renews this outbox's SQLite claims while they are published (started on first use)."""
        keeper = self._renewing
        if keeper is None:
            with self._backend_lock:
                if self._renewing is None:
                    self._renewing = _Keeper(self)
                keeper = self._renewing
        return keeper

    def close(self) -> None:
        keeper, self._renewing = self._renewing, None
        if keeper is not None:
            keeper.stop()
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


class _Claim:
    """One SQLite claim being published: its token, the rows it held at its last
    renewal, and when (monotonic) that renewal was sent."""

    def __init__(self, token: str, held: set[int], renewed_at: float) -> None:
        self.token = token
        self.held = held
        self.renewed_at = renewed_at


class _Keeper:
    """Renews the SQLite claims of one outbox every quarter of the lease while
    their rows are published, and before each push unless a renewal was sent
    less than a quarter of the lease ago: a push slower than the lease (a slow
    server, a long retry) does not let another relay take the rows and publish
    them too, and a row whose claim lapsed and was taken over (the relay was
    paused for longer than the lease) is left out. A relay that dies stops
    renewing, and its rows wait out the lease."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rainier-outbox-claims", daemon=True)
        self._thread.start()

    def add(self, claim: _Claim) -> None:
        with self._lock:
            self._claims[claim.token] = claim

    def remove(self, claim: _Claim) -> None:
        with self._lock:
            self._claims.pop(claim.token, None)

    def hold(self, claim: _Claim, seqs: Sequence[int]) -> set[int]:
        """Of ``seqs``, those ``claim`` still holds, renewed for another lease first
        unless that was done a moment ago."""
        if _clock.monotonic() - claim.renewed_at < self._outbox.lease / 4:
            return claim.held.intersection(seqs)
        self._renew(claim)
        return claim.held.intersection(seqs)

    def _renew(self, claim: _Claim) -> None:
        outbox = self._outbox
        sent = _clock.monotonic()
        rows = outbox.backend.stamped(
            f"UPDATE {OUTBOX} SET claimed_until = %s WHERE claim = %s RETURNING seq",
            lambda: (_clock.now() + outbox.lease, claim.token),
            fetch=True,
        )
        claim.held, claim.renewed_at = {int(seq) for (seq,) in rows}, sent

    def _run(self) -> None:
        outbox = self._outbox
        while not self._stopped.wait(outbox.lease / 4):
            with self._lock:
                claims = list(self._claims.values())
            for claim in claims:
                try:
                    self._renew(claim)
                except Exception as exc:  # noqa: BLE001 - the next turn tries again; the push checks its rows
                    log.warning("could not renew an outbox claim in %s: %s", outbox.target.label, exc)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
