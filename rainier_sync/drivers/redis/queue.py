"""The Redis driver: streams read through one consumer group.

Keys, under the connection's ``prefix`` ``P``:

- ``P<queue>:ready:<priority>``: a stream per priority band of a queue; the
  consumer group ``rainier`` hands its entries out, each worker process a named
  consumer. An entry holds ``j`` (the job's JSON envelope) and ``a`` (attempts
  already made).
- ``P<queue>:bands``: the queue's priority bands (sorted set, lowest first).
- ``P<queue>:delayed``: jobs not yet due, scored by due time.
- ``P<queue>:reserved``: reservations, scored by when they lapse.
- ``Pqueues`` (set), ``Pfailed`` (hash) and ``Pfailed:index`` (sorted set).

Every due time and every reservation deadline comes from
:func:`rainier_sync._clock.now` and is handed to the Lua scripts, so freezegun
moves them; Redis's own clock only backs the ``XAUTOCLAIM`` safety net. They are
taken as each command is sent, again for a try after a broken connection: the
driver retries itself (its connections never do), so a reservation that waited
out an outage is not recorded as already lapsed.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import select
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from ... import _clock
from ...errors import (
    ConfigurationError,
    DriverUnavailableError,
    PayloadError,
    RedisUnavailableError,
)
from ...types import (
    ExceptionInfo,
    FailedJob,
    QueueCounts,
    QueuedJob,
    as_exception_info,
    encode,
)
from ...types import (
    decode as decode_json,
)
from ..base import BaseQueue, Capabilities, QueueDriver, Waker, as_job_list
from .connection import (
    _check_url,
    _client,
    _connection_settings,
    _Reconnect,
    _retrying,
    _where,
)
from .scripts import SOURCES as _SOURCES

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

__all__ = ["RedisQueue", "RedisUnavailableError"]

log = logging.getLogger("rainier_sync")

_T = TypeVar("_T")

#: Jobs per EVALSHA when pushing or acknowledging in bulk (Lua's unpack limit is ~8000).
_CHUNK = 1000
#: Delayed jobs promoted per queue per reserve.
_PROMOTE = 1000
_GROUP = "rainier"


def _drop_if_closed(conn: Any) -> None:
    """Disconnect an idle connection the server closed (it is readable with nothing
    asked), so the next command opens a fresh one, as a pool checkout would."""
    try:
        if conn.can_read(timeout=0):
            conn.disconnect()
    except (redis.ConnectionError, OSError):
        conn.disconnect()


def _consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _Receipt(NamedTuple):
    """Where a reserved job's stream entry is, and its envelope to put back on release."""

    queue: str
    band: bytes
    entry: bytes
    body: bytes


def _num(value: float) -> str:
    return repr(float(value))


def _record(record: dict[str, Any]) -> str:
    """A failed-store record as JSON; ASCII, so that a lone surrogate a stored job
    brought in (``"\\ud800"`` is valid JSON) cannot stop it being written."""
    return json.dumps(record, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def _utf8(job: QueuedJob, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise PayloadError(f"job {job.id!r} ({job.name!r}) cannot be stored: not valid UTF-8 text: {exc}") from None


#: An entry an idle loop's blocking read took: queue, band, entry id, its fields,
#: and when (monotonic) the read was sent.
_Taken = tuple[str, bytes, bytes, list[bytes], float]


class _IdleRead:
    """One owning loop's blocking read: its connection, the streams an outstanding
    read covers (None when none is outstanding), and what it took."""

    __slots__ = ("conn", "client_id", "streams", "sent_at", "stash", "lock")

    def __init__(self) -> None:
        self.conn: Any = None
        self.client_id = 0
        self.streams: dict[bytes, tuple[str, bytes]] | None = None
        self.sent_at = 0.0
        self.stash: list[_Taken] = []
        self.lock = threading.Lock()


class RedisQueue(BaseQueue):
    """Jobs in Redis streams, read through one consumer group.

    Fast, and it can lose an accepted job (snapshot persistence, asynchronous
    replication, eviction): see the Redis driver's documentation before
    choosing it. Build it with :meth:`from_url`, or hand it a ``redis.Redis``
    client (``protocol=2``, ``decode_responses=False``).
    """

    driver = QueueDriver.REDIS
    capabilities = Capabilities(give_back=True, wakes=True, eviction_check=True)

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "rainier:queue:",
        reservation: float = 90,
        *,
        consumer: str | None = None,
        reconnect: bool = False,
    ) -> None:
        if not isinstance(prefix, str) or not prefix or not prefix.isprintable():
            raise ConfigurationError(f"redis connection: prefix must be a non-empty printable string, got {prefix!r}")
        if isinstance(reservation, bool) or not isinstance(reservation, (int, float)) or reservation <= 0:
            raise ConfigurationError(
                f"redis connection: reservation must be a positive number of seconds, got {reservation!r}"
            )
        self._client = client
        self.prefix = prefix
        self.reservation: float = float(reservation)
        #: This process's name in the consumer group (also its connections' client name).
        self.consumer = consumer or _consumer_name()
        self._scripts = {name: client.register_script(source) for name, source in _SOURCES.items()}
        # Idle wake-ups: a subscription to P + "wake", read by the waiting loops
        # themselves (whichever finds it readable first), bumps ``_wake_seq`` and
        # sets every waiting waker; a wait returns at once when a notification
        # came after the last reserve began.
        self._mutex = threading.Lock()
        self._waiters: set[Waker] = set()
        self._wake_seq = 0
        # per owning loop (thread): two workers on one driver must not consume
        # each other's notifications
        self._seen = threading.local()
        self._pubsub: Any = None
        self._listen_lock = threading.Lock()
        # An idle loop also blocks in XREADGROUP on a connection of its own (one
        # per owning loop), so a job pushed to a stream it reads reaches it with
        # the push, not a round trip after the notification. What that read takes
        # waits in the loop's stash for its next reserve_many.
        self._reads = threading.local()
        self._all_reads: set[_IdleRead] = set()
        self._blocking_reads = True
        self._subscribe_failures = 0
        self._subscribe_after = 0.0
        self._closed = threading.Event()
        self._streams_read: set[tuple[str, bytes]] = set()
        # The worker's owning loop acknowledges a batch and then reserves the
        # next; both go on one dedicated connection and the acknowledgement's
        # reply is read with the reservation's, so the pair costs one round trip.
        # ``_sent``: acknowledgements on that connection whose replies are unread;
        # ``_redo``: ones whose outcome is unknown, sent again before anything else.
        self._loop_lock = threading.RLock()
        self._loop_conn: Any = None
        self._sent: collections.deque[tuple[str, list[Any]]] = collections.deque()
        self._redo: list[tuple[str, list[Any]]] = []
        self._policy = _Reconnect(3, 1.0) if reconnect else _Reconnect()
        self._push_lock = threading.Lock()
        self._push_conn: Any = None
        self._pid = os.getpid()

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "rainier:queue:",
        reservation: float = 90,
        connect_timeout_ms: float | None = None,
        response_timeout_ms: float | None = None,
        reconnect: bool = False,
        reconnect_attempts: int | None = None,
        reconnect_max_backoff_ms: float | None = None,
    ) -> RedisQueue:
        """Build a queue on ``url`` (``redis://host:port/db``: the database index is the queue's own).

        ``connect_timeout_ms`` bounds opening a connection and ``response_timeout_ms``
        each reply; both unbounded unless given. With ``reconnect`` a command that
        meets a dropped, refused or timed-out connection is sent again on a new one,
        up to ``reconnect_attempts`` (default 3) more times, pausing 100 ms, 200 ms,
        400 ms... (at most ``reconnect_max_backoff_ms``, default 1000) in between, its
        times ("now", deadlines) taken afresh for each try. When every try fails, or
        without ``reconnect`` the first, it raises :class:`RedisUnavailableError`
        naming the connection (the worker reports it as ``queue_operation_failed``).
        """
        _check_url("redis connection", url)
        connect_timeout, response_timeout, policy = _connection_settings(
            "redis connection",
            connect_timeout_ms,
            response_timeout_ms,
            reconnect,
            reconnect_attempts,
            reconnect_max_backoff_ms,
        )
        consumer = _consumer_name()
        client = _client(url, connect_timeout, response_timeout, f"rainier-queue-{consumer}")
        queue = cls(client, prefix=prefix, reservation=reservation, consumer=consumer, reconnect=reconnect)
        queue._policy = policy
        return queue

    @property
    def client(self) -> redis.Redis:
        """The redis-py client this queue talks through."""
        return self._client

    def describe(self) -> str:
        return f"redis {_where(self._client)} prefix={self.prefix!r}"

    def _named(self) -> str:
        return f"redis connection {self.connection!r} ({self.describe()})"

    def _call(self, what: str, attempt: Callable[[], _T], broken: Callable[[], None] | None = None) -> _T:
        return _retrying(self._policy, self._named, what, attempt, broken)

    # -- producing -------------------------------------------------------------
    def _push_args(self, job: QueuedJob) -> list[Any]:
        """A job as the separate arguments of ``push()`` in Lua (for the scripts that push one job)."""
        return _utf8(job, self._line(job)).split(b"\t", 4)

    def _line(self, job: QueuedJob) -> str:
        """queue TAB priority TAB attempts TAB due TAB json; PayloadError naming the job if it cannot be stored."""
        queue = job.queue
        if not isinstance(queue, str) or not queue or "\t" in queue or "\n" in queue:
            raise PayloadError(
                f"job {job.id} ({job.name}): queue must be a non-empty string without tabs or newlines, got {queue!r}"
            )
        priority = job.priority
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise PayloadError(f"job {job.id} ({job.name}): priority must be an int, got {priority!r}")
        try:
            float(priority)  # a band's score in Redis: a double
            body = job.encode()
        except Exception as exc:  # noqa: BLE001 - NaN, a payload JSON cannot hold, nesting too deep...
            raise PayloadError(f"job {job.id} ({job.name}) cannot be stored: {type(exc).__name__}: {exc}") from None
        return f"{queue}\t{priority}\t{job.attempts}\t{float(job.available_at)!r}\t{body}"

    def _blob(self, jobs: Sequence[QueuedJob]) -> bytes:
        """The ``push`` script's jobs argument: one line per job."""
        text = "\n".join([self._line(job) for job in jobs])
        try:
            return text.encode()
        except UnicodeEncodeError:
            for job in jobs:  # which one: a lone surrogate somewhere in it
                _utf8(job, self._line(job))
            raise  # pragma: no cover - one of them could not be encoded

    def push(self, job: QueuedJob) -> str:
        self._on_push_connection("push_one", [[self.prefix, None, *self._push_args(job)]])
        return job.id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Store ``jobs`` in one pipeline (one script call per thousand jobs)."""
        if not jobs:
            return []
        chunks: list[list[Any]] = [
            [self.prefix, None, self._blob(jobs[start : start + _CHUNK])] for start in range(0, len(jobs), _CHUNK)
        ]
        self._on_push_connection("push", chunks)
        return [job.id for job in jobs]

    # -- consuming -------------------------------------------------------------
    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        if isinstance(queues, str):
            queues = [queues]
        if limit <= 0 or not queues:
            return []
        self._after_fork()
        self._seen.seq = self._wake_seq
        read: _IdleRead | None = getattr(self._reads, "read", None)
        if read is not None and (read.stash or read.streams is not None):
            jobs = self._take_stash(read, queues, limit)
            if jobs:
                return jobs  # at once: the caller reserves again for the rest, and this is its idle wake-up
        prefix, consumer, reservation = self.prefix, self.consumer, self.reservation

        def args() -> list[Any]:
            now = _clock.now()
            return [prefix, _GROUP, consumer, _num(now), _num(now + reservation), int(limit), _PROMOTE, *queues]

        return self._jobs_from(self._on_loop_connection("reserve", args))

    def _take_stash(self, read: _IdleRead, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        """Hand out (up to ``limit``) what this loop's blocking read took for ``queues``.

        Entries the read took moments ago go out at once, their reservations
        recorded by a script sent ahead of the next reply read on the loop
        connection: nothing can have claimed them from this consumer meanwhile,
        as the ``XAUTOCLAIM`` net only takes entries idle for a reservation. Older
        ones are first checked and recorded in one round trip, and only those
        still pending to this consumer go out.
        """
        with read.lock:
            self._collect(read, 0.0)
            wanted = set(queues)
            taken = [item for item in read.stash if item[0] in wanted][:limit]
            if not taken:
                return []
            for item in taken:
                read.stash.remove(item)
        recent = _clock.monotonic() - self.reservation / 3
        fresh = [item for item in taken if item[4] >= recent]
        older = [item for item in taken if item[4] < recent]
        if older:
            still = set(self._adopt(older))
            older = [item for item in older if item[2] in still]
        if fresh:
            try:
                self._send_deferred([("adopt", self._adopt_args(fresh))])
            except BaseException:
                with read.lock:
                    read.stash[:0] = fresh
                raise
        return self._taken_jobs(fresh + older)

    def _taken_jobs(self, items: Sequence[_Taken]) -> list[QueuedJob]:
        return self._jobs_from((queue.encode(), band, [(entry, fields)]) for queue, band, entry, fields, _ in items)

    def _adopt_args(self, items: Sequence[_Taken]) -> list[Any]:
        """The ``adopt`` script's arguments; the deadline (None here) is filled in as it is sent."""
        args: list[Any] = [self.prefix, _GROUP, self.consumer, None]
        for queue, band, entry, _, _ in items:
            args.extend((queue, band, entry))
        return args

    def _adopt(self, items: Sequence[_Taken]) -> list[bytes]:
        """Record the reservations of what the blocking read took that is still this
        consumer's; returns their entry ids."""
        args = self._adopt_args(items)
        return list(self._on_loop_connection("adopt", lambda: self._stamped("adopt", args)))

    def _stamped(self, script: str, args: list[Any]) -> list[Any]:
        """``args`` as sent now: an ``adopt`` gets its deadline from this moment."""
        if script == "adopt":
            args[3] = _num(_clock.now() + self.reservation)
        return args

    def _jobs_from(self, rows: Any) -> list[QueuedJob]:
        """Jobs from reserved entries, grouped as ``(queue, band, [(entry id, fields), ...])``;
        an entry nobody can read goes to the failed store instead."""
        jobs: list[QueuedJob] = []
        connection = self.connection
        decode_job = QueuedJob.decode
        for queue_raw, band, entries in rows:
            queue = queue_raw.decode()
            for entry, fields in entries:
                try:
                    if len(fields) == 4 and fields[0] == b"j" and fields[2] == b"a":
                        body, attempts = fields[1], fields[3]
                    else:
                        named = dict(zip(fields[::2], fields[1::2], strict=False))
                        if b"j" not in named:
                            raise PayloadError("the stream entry has no 'j' (job) field")
                        body, attempts = named[b"j"], named.get(b"a", b"0")
                    if not attempts.isdigit() or len(attempts) > 9:
                        raise PayloadError(f"the stream entry's attempts field is not a count: {attempts[:40]!r}")
                    job = decode_job(body, connection=connection, receipt=_Receipt(queue, band, entry, body))
                    job.attempts = int(attempts) + 1
                except Exception as exc:  # noqa: BLE001 - whatever it is, this entry alone is unreadable
                    try:
                        self._discard(queue, band, entry, fields, exc)
                    except Exception as error:  # noqa: BLE001 - the jobs reserved with it must still be handed out
                        log.error(
                            "queue %r: could not move unreadable stream entry %s to the failed store (%s); "
                            "it is looked at again when its reservation lapses",
                            queue,
                            entry.decode(),
                            error,
                        )
                    continue
                jobs.append(job)
            if (queue, band) not in self._streams_read:
                self._streams_read.add((queue, band))
        return jobs

    def _discard(self, queue: str, band: bytes, entry: bytes, fields: list[bytes], exc: Exception) -> None:
        """An entry nobody can run: into the failed store (keeping its raw fields), and say so."""
        named = zip(fields[::2], fields[1::2], strict=False)
        raw = encode({k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in named})
        info = ExceptionInfo.from_exception(exc)
        entry_id = entry.decode()
        failed_id = f"unreadable-{queue}-{entry_id}"
        job = {"id": failed_id, "name": "<unreadable>", "queue": queue, "payload": {}, "priority": int(band)}

        def args() -> list[Any]:
            now = _clock.now()
            record = {"job": job, "raw": raw, "error": info.error, "exception": info.to_dict(), "failed_at": now}
            return [self.prefix, _GROUP, queue, band, entry, failed_id, _record(record), _num(now), "0"]

        self._on_loop_connection("fail", args)
        log.error("queue %r: discarded unreadable stream entry %s: %s", queue, entry_id, info.error)
        self.announce_discarded(info, raw)

    @staticmethod
    def _receipt(job: QueuedJob) -> _Receipt | None:
        receipt = job.receipt
        return receipt if isinstance(receipt, _Receipt) else None

    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        """XACK and XDEL every job's entry, grouped per stream, in one script call per thousand."""
        streams: dict[tuple[str, bytes], list[bytes]] = {}
        for job in jobs:
            receipt = self._receipt(job)
            if receipt is not None:
                streams.setdefault((receipt.queue, receipt.band), []).append(receipt.entry)
        if not streams:
            return
        calls: list[list[Any]] = []
        args: list[Any] = [self.prefix, _GROUP]
        count = 0
        for (queue, band), ids in streams.items():
            for start in range(0, len(ids), _CHUNK):
                part = ids[start : start + _CHUNK]
                if count + len(part) > _CHUNK and count:
                    calls.append(args)
                    args, count = [self.prefix, _GROUP], 0
                args.extend((queue, band, len(part), *part))
                count += len(part)
        calls.append(args)
        self._send_deferred([("ack", call) for call in calls])

    def _send_deferred(self, calls: list[tuple[str, list[Any]]]) -> None:
        """Send script calls on the loop connection without waiting: their replies are
        read before the next reply wanted there, and a call whose outcome is unknown is
        made again (each is harmless to repeat)."""
        self._after_fork()
        unsent = collections.deque(calls)
        with self._loop_lock:
            try:
                self._call("acknowledge", lambda: self._send_on_loop(unsent), self._loop_broken)
            finally:
                self._redo.extend(unsent)  # never sent: the next operation sends them

    def _send_on_loop(self, unsent: collections.deque[tuple[str, list[Any]]]) -> None:
        conn = self._loop_connection()
        if self._redo:
            self._redo_acks(conn)
        while unsent:
            # EVAL, not EVALSHA: a reply nobody may read before the process
            # exits must not be NOSCRIPT (a fresh server, a failover, SCRIPT FLUSH)
            name, call_args = unsent[0]
            conn.send_command("EVAL", _SOURCES[name], 0, *self._stamped(name, call_args))
            self._sent.append(unsent.popleft())

    # -- the owning loop's connection --------------------------------------------------
    def _after_fork(self) -> None:
        """In a child process, forget the parent's connections and listener: sharing
        a socket across processes would interleave their replies."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._loop_conn = self._push_conn = None
        self._sent.clear()
        self._redo.clear()
        self._pubsub = None
        self._listen_lock = threading.Lock()
        self._reads = threading.local()
        self._all_reads = set()
        self._loop_lock = threading.RLock()
        self._push_lock = threading.Lock()
        self._mutex = threading.Lock()
        self._waiters = set()

    def _loop_connection(self) -> Any:
        """The loop connection, connected: the arguments about to be built must be
        taken after any wait for a connection."""
        conn = self._loop_conn
        if conn is None:
            conn = self._loop_conn = self._client.connection_pool.get_connection()
        elif not self._sent:
            _drop_if_closed(conn)
        if conn._sock is None:
            conn.connect()
        return conn

    def _loop_broken(self) -> None:
        """The loop connection failed: drop it; acknowledgements not confirmed go again."""
        conn, self._loop_conn = self._loop_conn, None
        self._redo.extend(self._sent)
        self._sent.clear()
        if conn is not None:
            conn.disconnect()
            self._client.connection_pool.release(conn)

    def _read_acks(self, conn: Any) -> None:
        """Read the replies of acknowledgements sent earlier (in order, before any later reply)."""
        while self._sent:
            try:
                conn.read_response()
            except redis.ResponseError:
                # OOM under noeviction, a replica that became read-only...: sent again by the next operation
                self._redo.append(self._sent.popleft())
                continue
            self._sent.popleft()

    def _redo_acks(self, conn: Any) -> None:
        """Send again, one at a time, the deferred calls whose outcome is unknown."""
        self._read_acks(conn)
        while self._redo:
            name, args = self._redo[0]
            conn.send_command("EVAL", _SOURCES[name], 0, *self._stamped(name, args))
            conn.read_response()
            self._redo.pop(0)

    def _sync(self) -> None:
        """Confirm every acknowledgement sent so far (called before other operations, to keep order)."""
        self._after_fork()
        if not self._sent and not self._redo:
            return
        with self._loop_lock:
            self._call("acknowledge", lambda: self._redo_acks(self._loop_connection()), self._loop_broken)

    def _on_push_connection(self, script: str, calls: list[list[Any]]) -> None:
        """Run ``script`` once per argument list in ``calls`` (each with "now" second,
        filled in as it is sent), pipelined on the producers' own connection: a
        dispatch skips the pool's checkout (a third of its cost). A second thread
        dispatching meanwhile takes a pooled connection instead."""
        self._after_fork()
        if self._push_lock.acquire(blocking=False):
            try:
                self._call("dispatch", lambda: self._push_on(self._push_connection(), script, calls))
            finally:
                self._push_lock.release()
            return
        pool = self._client.connection_pool

        def borrowed() -> None:
            conn = pool.get_connection()
            try:
                self._push_on(conn, script, calls)
            finally:
                pool.release(conn)

        self._call("dispatch", borrowed)

    def _push_connection(self) -> Any:
        conn = self._push_conn
        if conn is None:
            conn = self._push_conn = self._client.connection_pool.get_connection()
        else:
            _drop_if_closed(conn)
        return conn

    def _push_on(self, conn: Any, script: str, pending: list[list[Any]]) -> None:
        """Send every call in ``pending``, then read every reply. A call leaves
        ``pending`` once its reply is read, so a retry sends only the unanswered
        ones; every reply is read, also after an error, since one left unread would
        be taken by the next dispatch on this connection as its own."""
        if conn._sock is None:
            conn.connect()
        command: tuple[str, str] = ("EVALSHA", self._scripts[script].sha)
        error: redis.ResponseError | None = None
        try:
            while pending:
                now = _num(_clock.now())
                for args in pending:
                    args[1] = now
                    conn.send_command(*command, 0, *args)
                unloaded: list[list[Any]] = []
                answered = 0
                try:
                    for args in pending:
                        try:
                            conn.read_response()
                        except redis.exceptions.NoScriptError:
                            unloaded.append(args)
                        except redis.ResponseError as exc:
                            error = error or exc
                        answered += 1
                finally:
                    pending[:answered] = unloaded
                if pending:  # not cached (a fresh server, SCRIPT FLUSH): by its text
                    command = ("EVAL", _SOURCES[script])
        except BaseException:
            conn.disconnect()  # with any reply on it unread
            raise
        if error is not None:
            raise error

    def _on_loop_connection(self, script: str, args: Callable[[], list[Any]]) -> Any:
        """Run ``script`` on the loop connection, reading unread acknowledgement replies
        on the way; ``args`` builds its arguments as it is sent, again for each try."""
        self._after_fork()
        with self._loop_lock:
            return self._call(script, lambda: self._on_loop(script, args), self._loop_broken)

    def _on_loop(self, script: str, args: Callable[[], list[Any]]) -> Any:
        conn = self._loop_connection()
        if self._redo:
            self._redo_acks(conn)
        conn.send_command("EVALSHA", self._scripts[script].sha, 0, *args())
        self._read_acks(conn)
        try:
            return conn.read_response()
        except redis.exceptions.NoScriptError:
            pass
        # not cached (a fresh server, a failover, SCRIPT FLUSH): by its text, which caches it
        conn.send_command("EVAL", _SOURCES[script], 0, *args())
        return conn.read_response()

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self._put_back(job, delay, job.attempts)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs go back on their stream at once, their attempt uncounted."""
        for job in jobs:
            self._put_back(job, 0.0, max(0, job.attempts - 1))

    def defer(self, job: QueuedJob, delay: float) -> None:
        """Back to the delayed set, due in ``delay`` seconds, its attempt uncounted."""
        self._put_back(job, delay, max(0, job.attempts - 1))

    def _put_back(self, job: QueuedJob, delay: float, attempts: int) -> None:
        receipt = self._receipt(job)
        if receipt is None:
            return
        delay = max(0.0, float(delay))

        def args() -> list[Any]:
            now = _clock.now()
            return [
                self.prefix,
                _GROUP,
                receipt.queue,
                receipt.band,
                receipt.entry,
                _num(now),
                _num(now + delay),
                str(attempts),
                receipt.body,
            ]

        self._on_loop_connection("release", args)

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        info = as_exception_info(error)
        wire, details = job.to_wire(), info.to_dict()
        receipt = self._receipt(job)
        queue, band, entry = (receipt.queue, receipt.band, receipt.entry) if receipt else (job.queue, b"0", b"0-0")
        held = "1" if receipt else "0"
        failed_at = 0.0

        def args() -> list[Any]:
            nonlocal failed_at
            failed_at = _clock.now()
            record = {"job": wire, "error": info.error, "exception": details, "failed_at": failed_at}
            return [self.prefix, _GROUP, queue, band, entry, job.id, _record(record), _num(failed_at), held]

        self._on_loop_connection("fail", args)
        return FailedJob.of(job, info, failed_at)

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        """Push running jobs' deadlines out and re-claim their entries for this consumer
        (``XCLAIM ... JUSTID``), so neither sweep takes them from a live worker."""
        held: list[Any] = []
        for job in as_job_list(jobs):
            receipt = self._receipt(job)
            if receipt is not None:
                held.extend((receipt.queue, receipt.band, receipt.entry))
        if not held:
            return
        period = self.reservation if seconds is None else float(seconds)
        if not math.isfinite(period):
            raise ValueError(f"{self._named()}: extend: seconds must be a finite number, got {seconds!r}")

        def args() -> list[Any]:
            return [self.prefix, _GROUP, self.consumer, _num(_clock.now() + period), *held]

        self._on_loop_connection("extend", args)

    def reclaim_expired(self) -> int:
        """Put every job whose reservation lapsed back on its queue; returns how many.

        Also forgets group consumers (worker processes) that hold nothing and have
        not been heard from for ten reservations."""
        reservation_ms = int(self.reservation * 1000)

        def args() -> list[Any]:
            now = _num(_clock.now())
            return [self.prefix, _GROUP, self.consumer, now, reservation_ms, _PROMOTE, 10 * reservation_ms]

        return int(self._on_loop_connection("reclaim", args))

    # -- the failed store ---------------------------------------------------------
    def _failed_from(self, failed_id: str, raw: bytes | None) -> FailedJob | None:
        if raw is None:
            return None
        try:
            record = decode_json(raw)
            info = ExceptionInfo.from_dict(record.get("exception", record.get("error", "")))
            job = QueuedJob.from_wire(record["job"], connection=self.connection)
            failed = FailedJob.of(job, info, float(record.get("failed_at", 0.0)))
            failed.error = str(record.get("error", info.error))
            return failed
        except Exception as exc:  # noqa: BLE001 - listed as unreadable, never raised: the others must still list
            info = ExceptionInfo.from_message(f"the failed-job record is unreadable: {type(exc).__name__}: {exc}")
            return FailedJob(
                id=failed_id,
                name="<unreadable>",
                queue="?",
                connection=self.connection,
                payload={},
                error=info.error,
                exception=info,
                failed_at=0.0,
            )

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        if limit <= 0:
            return []

        def read() -> tuple[Any, Any]:
            ids: Any = self._client.zrevrange(self.prefix + "failed:index", 0, limit - 1)
            return ids, (self._client.hmget(self.prefix + "failed", ids) if ids else [])

        ids, records = self._call("failed_jobs", read)
        out = []
        for failed_id, raw in zip(ids, records, strict=True):
            failed = self._failed_from(failed_id.decode(), raw)
            if failed is not None:
                out.append(failed)
        return out

    def failed_count(self) -> int:
        return int(self._call("failed_count", lambda: self._client.zcard(self.prefix + "failed:index")))

    def retry_failed(self, id: str) -> bool:
        raw: Any = self._call("retry_failed", lambda: self._client.hget(self.prefix + "failed", id))
        if raw is None:
            return False
        pushed = self._retry_args(id, raw)

        def retry() -> Any:
            now = _num(_clock.now())
            pushed[3] = now  # due at once
            return self._scripts["retry"](args=[self.prefix, now, id, *pushed])

        return bool(self._call("retry_failed", retry))

    def _retry_args(self, id: str, raw: bytes) -> list[Any]:
        """``push()``'s arguments for a failed job going back on its queue, due time
        left to fill in; PayloadError when its record cannot be read."""
        try:
            record = decode_json(raw)
            raw_fields = record.get("raw")
            if isinstance(raw_fields, str):
                # An unreadable entry goes back as it came, so whoever repairs the
                # consumer (or the producer) gets another go at it.
                fields = decode_json(raw_fields)
                wire = record["job"]
                return [wire["queue"], str(int(wire.get("priority", 0))), "0", None, fields.get("j", raw_fields)]
            job = QueuedJob.from_wire(record.get("job"), connection=self.connection)
            job.attempts = 0
            queue, priority, attempts, _, _ = self._line(job).split("\t", 4)
            # as ASCII JSON: a lone surrogate the job came in with (a "\\ud800" escape) goes back the same way
            return [queue, priority, attempts, None, _record(job.to_wire())]
        except Exception as exc:  # noqa: BLE001 - any record nobody can read is refused the same way
            raise PayloadError(
                f"failed job {id!r} cannot be retried: its record is unreadable: {type(exc).__name__}: {exc}"
            ) from None

    def forget_failed(self, id: str) -> bool:
        return bool(self._call("forget_failed", lambda: self._scripts["forget"](args=[self.prefix, id])))

    # -- inspection -------------------------------------------------------------
    def counts(self, queue: str) -> QueueCounts:
        self._sync()
        ready, delayed, reserved = self._call(
            "counts", lambda: self._scripts["counts"](args=[self.prefix, _num(_clock.now()), queue])
        )
        return QueueCounts(ready=max(0, int(ready)), delayed=int(delayed), reserved=int(reserved))

    def size(self, queue: str | None = None) -> int:
        queues = [queue] if queue is not None else self.queue_names()
        return sum(self.counts(name).total for name in queues)

    def queue_names(self) -> list[str]:
        names: Any = self._call("queue_names", lambda: self._client.smembers(self.prefix + "queues"))
        return sorted(name.decode() for name in names)

    def check_eviction_policy(self) -> str | None:
        """Read ``maxmemory-policy``; log a warning unless it is ``noeviction``.

        Returns the policy, or None when the server will not say (``CONFIG`` disabled).
        """
        try:
            reply: Any = self._call("check_eviction_policy", lambda: self._client.config_get("maxmemory-policy"))
        except redis.ResponseError as exc:
            log.warning("could not read Redis maxmemory-policy (%s); make sure it is noeviction", exc)
            return None
        value = reply.get(b"maxmemory-policy", reply.get("maxmemory-policy"))
        policy = value.decode() if isinstance(value, bytes) else str(value)
        if policy != "noeviction":
            log.warning(
                "Redis maxmemory-policy is %r: under memory pressure Redis may evict this queue's keys and "
                "lose jobs silently; set maxmemory-policy noeviction",
                policy,
            )
        return policy

    # -- waiting -------------------------------------------------------------------
    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Sleep until a job may be there for ``queues`` — this loop's blocking read of
        their streams took one, or a push, release or reclaim notified — until the
        soonest delayed job is due, ``waker`` is set, or ``timeout`` passes."""
        self._sync()
        with self._mutex:
            self._waiters.add(waker)
            notified = self._wake_seq != getattr(self._seen, "seq", -1)
        try:
            if notified:
                return
            if self._closed.is_set():
                waker.wait(timeout)
                return
            # Subscribe (or notice a dropped subscription) before looking for the
            # soonest delayed job, so a push in between is seen by one or the other.
            subscription = self._subscription()
            if subscription is not None and self._drain(subscription):
                return  # notified, or just subscribed: what was published before is unknown

            def look() -> Any:
                pipe = self._client.pipeline(transaction=False)
                for queue in queues:
                    pipe.zrange(self.prefix + queue + ":delayed", 0, 0, withscores=True)
                    pipe.zrange(self.prefix + queue + ":bands", 0, -1)
                return pipe.execute()

            replies = self._call("wait_for_jobs", look)
            soonest = min((rows[0][1] for rows in replies[0::2] if rows), default=None)
            if soonest is not None:
                timeout = min(timeout, max(0.0, float(soonest) - _clock.now()))
            streams = [(queue, band) for queue, bands in zip(queues, replies[1::2], strict=True) for band in bands]
            read = self._idle_read()
            if read.stash:
                return  # taken while this loop was busy: its next reserve hands them out
            if subscription is None:
                # nothing would tell this wait of a release, a retry or a reclaim: it ends
                # when the subscription may be opened again
                timeout = min(timeout, max(0.01, self._subscribe_after - _clock.monotonic()))
                if not (streams and self._blocking_reads):
                    waker.wait(timeout)
                    return
            self._wait_reading(read, subscription, streams, timeout, waker)
        finally:
            with self._mutex:
                self._waiters.discard(waker)

    def _idle_read(self) -> _IdleRead:
        """This owning loop's blocking-read state (made on first use)."""
        read: _IdleRead | None = getattr(self._reads, "read", None)
        if read is None:
            read = self._reads.read = _IdleRead()
            with self._mutex:
                self._all_reads.add(read)
        return read

    def _wait_reading(
        self, read: _IdleRead, pubsub: Any, streams: list[tuple[str, bytes]], timeout: float, waker: Waker
    ) -> None:
        """``select()`` on this loop's blocking read, the subscription and ``waker`` together."""
        deadline = _clock.monotonic() + timeout
        while not waker.is_set() and not self._closed.is_set():
            remaining = deadline - _clock.monotonic()
            if remaining <= 0.001:
                return
            with read.lock:
                if read.streams is None and streams and self._blocking_reads:
                    self._start_read(read, streams, remaining)
                reading = read.conn._sock if read.streams is not None and read.conn is not None else None
            watched: list[Any] = [waker.fileno()]
            listening = pubsub.connection._sock if pubsub is not None and pubsub.connection is not None else None
            if listening is not None:
                watched.append(listening)
            if reading is not None:
                watched.append(reading)
            try:
                readable, _, _ = select.select(watched, [], [], remaining)
            except (OSError, ValueError, TypeError):  # a socket closed under us
                if pubsub is not None:
                    self._drain(pubsub)
                return
            if waker.is_set():
                return
            if reading is not None:
                with read.lock:
                    refused = self._collect(read, 0.0)
                if read.stash or refused:
                    return
            if listening is not None and listening in readable and self._drain(pubsub):
                return
            if pubsub is not None and pubsub.connection is None:
                return  # another loop found the subscription broken and dropped it

    def _start_read(self, read: _IdleRead, streams: list[tuple[str, bytes]], seconds: float) -> None:
        """Send ``XREADGROUP … BLOCK`` for one new entry of each stream (``read.lock`` held).
        It ends by itself within a second, so a read nobody collects lapses soon."""
        if read.conn is None:
            conn: Any = self._client.connection_pool.get_connection()
            try:
                conn.send_command("CLIENT", "ID")
                read.client_id = int(conn.read_response())
            except redis.ResponseError as exc:  # CLIENT refused (an ACL, a renamed command)
                self._client.connection_pool.release(conn)
                self._blocking_reads = False
                log.warning("redis: idle workers wait on notifications only (CLIENT ID refused: %s)", exc)
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                conn.disconnect()
                self._client.connection_pool.release(conn)
                log.debug("redis blocking read: %s; waiting on notifications until the next wait", exc)
                return
            read.conn = conn
        keys = [f"{self.prefix}{queue}:ready:{band.decode()}" for queue, band in streams]
        block_ms = max(1, int(min(seconds, 1.0) * 1000))
        try:
            read.conn.send_command(
                "XREADGROUP",
                "GROUP",
                _GROUP,
                self.consumer,
                "COUNT",
                1,
                "BLOCK",
                block_ms,
                "STREAMS",
                *keys,
                *([">"] * len(keys)),
            )
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._drop_read(read, exc)
            return
        read.streams = {key.encode(): stream for key, stream in zip(keys, streams, strict=True)}
        read.sent_at = _clock.monotonic()

    def _collect(self, read: _IdleRead, timeout: float) -> bool:
        """Read the blocking read's reply into the stash if it is there (``read.lock``
        held); True when Redis refused the read (a band no reserve has read yet)."""
        conn = read.conn
        if read.streams is None or conn is None:
            return False
        if conn._sock is None:  # disconnected under us: its reply is gone with it
            self._drop_read(read, ConnectionError("the blocking read's connection was closed"))
            return False
        try:
            if not conn.can_read(timeout=timeout):
                return False
            reply: Any = conn.read_response()
        except redis.ResponseError as exc:
            # NOGROUP: a band no reserve has read yet. The next reserve creates its group.
            log.debug("redis blocking read refused: %s", exc)
            read.streams = None
            return True
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            # What it had taken is pending to this consumer with no reservation on
            # record: reclaim_expired's XAUTOCLAIM puts it back once a reservation long.
            self._drop_read(read, exc)
            return False
        streams, read.streams = read.streams, None
        for key, entries in reply or ():
            queue, band = streams[key]
            for entry, fields in entries:
                read.stash.append((queue, band, entry, fields, read.sent_at))
        return False

    def _drop_read(self, read: _IdleRead, exc: BaseException) -> None:
        log.debug("redis blocking read: %s; waiting on notifications until the next wait", exc)
        conn, read.conn, read.streams = read.conn, None, None
        if conn is not None:
            conn.disconnect()
            self._client.connection_pool.release(conn)

    def worker_stopped(self) -> None:
        """End the blocking read the stopping worker's loop (this thread) left
        outstanding, and hand back what it took."""
        self._after_fork()
        read: _IdleRead | None = getattr(self._reads, "read", None)
        if read is not None:
            self._reads.read = None
            self._end_read(read)

    def _end_read(self, read: _IdleRead) -> None:
        """End an outstanding blocking read and hand back, unstarted and uncounted,
        whatever it took that is still this consumer's."""
        with self._mutex:
            self._all_reads.discard(read)
        with read.lock:
            if read.streams is not None and read.conn is not None:
                try:
                    self._client.client_unblock(read.client_id)
                except Exception as exc:  # noqa: BLE001 - it ends by itself within a second
                    log.debug("redis: CLIENT UNBLOCK refused (%s); waiting for the read to end", exc)
                self._collect(read, 2.0)
                if read.streams is not None:
                    self._drop_read(read, TimeoutError("the blocking read did not end"))
            if read.conn is not None:
                self._client.connection_pool.release(read.conn)
                read.conn = None
            stash, read.stash = read.stash, []
        if not stash:
            return
        still = set(self._adopt(stash))
        for job in self._taken_jobs([item for item in stash if item[2] in still]):
            self._put_back(job, 0.0, max(0, job.attempts - 1))

    def _subscription(self) -> Any:
        """The wake-up subscription, opened on first use (None while Redis refuses it)."""
        self._after_fork()
        if self._pubsub is not None:
            return self._pubsub
        with self._listen_lock:
            if self._pubsub is None and not self._closed.is_set() and _clock.monotonic() >= self._subscribe_after:
                pubsub: Any = self._client.pubsub()  # type: ignore[no-untyped-call]
                try:
                    pubsub.subscribe(self.prefix + "wake")
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    self._subscription_lost(pubsub, exc)
                else:
                    self._subscribe_failures = 0
                    self._pubsub = pubsub
            return self._pubsub

    def _subscription_lost(self, pubsub: Any, exc: BaseException) -> None:
        """Drop a broken subscription; waits fall back to their timeout until it reopens."""
        self._subscribe_failures += 1
        self._subscribe_after = _clock.monotonic() + min(0.05 * 2**self._subscribe_failures, 2.0)
        log.debug("redis wake-up subscription: %s; subscribing again shortly", exc)
        if self._pubsub is pubsub:
            self._pubsub = None
        try:
            pubsub.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass

    def _drain(self, pubsub: Any) -> bool:
        """Read every message already arrived; True (and every waiting loop woken) if
        any did, or if the subscription broke, since a notification may be lost then.
        The subscription's own confirmation counts: before it, nothing was heard."""
        with self._listen_lock:
            if self._pubsub is not pubsub:
                got = True  # replaced or dropped meanwhile
            else:
                got = False
                try:
                    while pubsub.get_message(timeout=0.0) is not None:
                        got = True
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    self._subscription_lost(pubsub, exc)
                    got = True
        if got:
            self._notify()
        return got

    def _notify(self) -> None:
        with self._mutex:
            self._wake_seq += 1
            waiters = list(self._waiters)
        for waker in waiters:
            waker.set()

    def close(self) -> None:
        self._after_fork()
        self._closed.set()  # first: no loop sends a new blocking read while the old ones end
        with self._mutex:
            reads = list(self._all_reads)
        for read in reads:
            try:
                self._end_read(read)
            except Exception as exc:  # noqa: BLE001 - closing: what the read took lapses and runs again
                log.warning("redis queue closing: could not hand back what a blocking read took: %s", exc)
        try:
            self._sync()
        except Exception as exc:  # noqa: BLE001 - closing: their reservations lapse and they run again
            log.warning(
                "redis queue closing: %d acknowledgement(s) unconfirmed: %s", len(self._sent) + len(self._redo), exc
            )
        with self._loop_lock:
            if self._loop_conn is not None:
                self._client.connection_pool.release(self._loop_conn)
                self._loop_conn = None
        with self._push_lock:
            if self._push_conn is not None:
                self._client.connection_pool.release(self._push_conn)
                self._push_conn = None
        with self._listen_lock:
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            self._forget_consumer()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self._client.close()

    def _forget_consumer(self) -> None:
        """Remove this consumer from the groups it read from, where it holds nothing."""
        for queue, band in self._streams_read:
            stream = f"{self.prefix}{queue}:ready:{band.decode()}"
            try:
                consumers: Any = self._client.xinfo_consumers(stream, _GROUP)
                for consumer in consumers:
                    name = consumer.get("name", consumer.get(b"name"))
                    name = name.decode() if isinstance(name, bytes) else name
                    if name == self.consumer and int(consumer.get("pending", 0)) == 0:
                        self._client.xgroup_delconsumer(stream, _GROUP, self.consumer)
            except redis.ResponseError:
                continue
