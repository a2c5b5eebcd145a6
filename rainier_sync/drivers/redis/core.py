"""The Redis driver's client, settings and the connections its scripts run on.

The worker's owning loop acknowledges a batch and then reserves the next; both
go on one dedicated connection (the loop connection) and the acknowledgement's
reply is read with the reservation's, so the pair costs one round trip.
Producers pipeline their pushes on a connection of their own. Both are
forgotten in a forked child, so a socket is never shared across processes.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from ... import _clock
from ..._checks import check_number
from ...errors import ConfigurationError, DriverUnavailableError
from ...types import ExceptionInfo, QueuedJob
from ..base import BaseQueue
from .connection import _Reconnect, _retrying, _where
from .scripts import SOURCES as _SOURCES
from .wire import _GROUP, _entry_job, _failed_record, _num, _raw_fields, _receipt, _unreadable

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

log = logging.getLogger("rainier_sync")

_T = TypeVar("_T")


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


class _RedisCore(BaseQueue):
    """The client, the settings, and running scripts on the loop and producer connections."""

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
        check_number("redis connection: reservation", reservation, unit="seconds")
        self._client = client
        self.prefix = prefix
        self.reservation: float = float(reservation)
        #: This process's name in the consumer group (also its connections' client name).
        self.consumer = consumer or _consumer_name()
        self._scripts = {name: client.register_script(source) for name, source in _SOURCES.items()}
        self._streams_read: set[tuple[str, bytes]] = set()
        # ``_sent``: acknowledgements on the loop connection whose replies are unread;
        # ``_redo``: ones whose outcome is unknown, sent again before anything else.
        self._loop_lock = threading.RLock()
        self._loop_conn: Any = None
        self._sent: collections.deque[tuple[str, list[Any]]] = collections.deque()
        self._redo: list[tuple[str, list[Any]]] = []
        self._policy = _Reconnect(3, 1.0) if reconnect else _Reconnect()
        self._push_lock = threading.Lock()
        self._push_conn: Any = None
        self._pid = os.getpid()

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

    # -- fork detection ------------------------------------------------------------
    def _after_fork(self) -> None:
        """In a child process, forget the parent's connections and listener: sharing
        a socket across processes would interleave their replies."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._forked()

    def _forked(self) -> None:
        """Reset what a child process must not share with its parent (extended by the parts)."""
        self._loop_conn = self._push_conn = None
        self._sent.clear()
        self._redo.clear()
        self._loop_lock = threading.RLock()
        self._push_lock = threading.Lock()

    # -- the owning loop's connection ------------------------------------------------
    def _stamped(self, script: str, args: list[Any]) -> list[Any]:
        """``args`` as sent now: an ``adopt`` gets its deadline from this moment."""
        if script == "adopt":
            args[3] = _num(_clock.now() + self.reservation)
        return args

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

    # -- the producers' connection -----------------------------------------------------
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

    # -- reserved entries --------------------------------------------------------------
    def _jobs_from(self, rows: Any) -> list[QueuedJob]:
        """Jobs from reserved entries, grouped as ``(queue, band, [(entry id, fields), ...])``;
        an entry nobody can read goes to the failed store instead."""
        jobs: list[QueuedJob] = []
        connection = self.connection
        for queue_raw, band, entries in rows:
            queue = queue_raw.decode()
            for entry, fields in entries:
                try:
                    job = _entry_job(queue, band, entry, fields, connection)
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
        raw = _raw_fields(fields)
        info = ExceptionInfo.from_exception(exc)
        failed_id, job = _unreadable(queue, band, entry)

        def args() -> list[Any]:
            now = _clock.now()
            record = _failed_record(job, info, now, raw)
            return [self.prefix, _GROUP, queue, band, entry, failed_id, record, _num(now), "0"]

        self._on_loop_connection("fail", args)
        log.error("queue %r: discarded unreadable stream entry %s: %s", queue, entry.decode(), info.error)
        self.announce_discarded(info, raw)

    def _put_back(self, job: QueuedJob, delay: float, attempts: int) -> None:
        receipt = _receipt(job)
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
