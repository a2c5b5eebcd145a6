"""The Redis driver's client, settings and the connections its scripts run on.

The worker's owning loop acknowledges a batch and then reserves the next; both
go on one dedicated connection per server (the loop's line) and the
acknowledgement's reply is read with the reservation's, so the pair costs one
round trip. Producers pipeline their pushes on a connection of their own per
server. All are forgotten in a forked child, so a socket is never shared
across processes. On one server (or under Sentinel) there is one server; on a
cluster, each node serving a queue's slot has its own line.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ... import _clock
from ..._checks import check_number
from ...errors import ConfigurationError, DriverUnavailableError
from ...types import ExceptionInfo, QueuedJob
from ..base import BaseQueue
from .connection import _REDIRECTED, _Reconnect, _retrying
from .keys import _Keys
from .scripts import SOURCES as _SOURCES
from .scripts import Script
from .topology import _Topology
from .wire import _GROUP, _entry_job, _failed_record, _num, _raw_fields, _receipt, _unreadable

try:
    import redis
    from redis.exceptions import ReadOnlyError, TryAgainError
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

log = logging.getLogger("rainier_sync")

_T = TypeVar("_T")

#: Replies to a call that did not run and is to be sent again (after the line is dropped).
_AGAIN = (*_REDIRECTED, ReadOnlyError, TryAgainError, redis.exceptions.ClusterDownError)


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


class _Call:
    """One script call: its name, keys and arguments (sent again as they are
    when its outcome is unknown; the first key says where it goes), and where its
    reply goes when the caller wants it (``reply``: appended to as it is read)."""

    __slots__ = ("name", "keys", "args", "reply")

    def __init__(self, name: str, keys: list[str], args: list[Any], reply: list[Any] | None = None) -> None:
        self.name = name
        self.keys = keys
        self.args = args
        self.reply = reply


class _Line:
    """A connection of the driver's own to one server, and the deferred calls
    sent on it whose replies are still to be read."""

    __slots__ = ("pool", "conn", "sent", "generation")

    def __init__(self, pool: Any, conn: Any, generation: int) -> None:
        self.pool = pool
        self.conn = conn
        self.sent: collections.deque[_Call] = collections.deque()
        self.generation = generation


class _RedisCore(BaseQueue):
    """The client, the settings, and running scripts on the loop and producer connections."""

    def __init__(
        self,
        client: Any,
        prefix: str = "rainier:queue:",
        reservation: float = 90,
        *,
        consumer: str | None = None,
        reconnect: bool = False,
    ) -> None:
        if not isinstance(prefix, str) or not prefix or not prefix.isprintable():
            raise ConfigurationError(f"redis connection: prefix must be a non-empty printable string, got {prefix!r}")
        check_number("redis connection: reservation", reservation, unit="seconds")
        self._topology = client if isinstance(client, _Topology) else _Topology.of(client)
        self.prefix = prefix  # and with it, the key names
        self.reservation: float = float(reservation)
        #: This process's name in the consumer group (also its connections' client name).
        self.consumer = consumer or _consumer_name()
        self._scripts = {name: Script(name, source) for name, source in _SOURCES.items()}
        self._streams_read: set[tuple[str, bytes]] = set()
        #: Queues this process added to the queues set itself (on a cluster, where no script can).
        self._registered: set[str] = set()
        # ``line.sent``: calls on a loop line whose replies are unread; ``_redo``:
        # ones whose outcome is unknown, sent again before anything else.
        self._loop_lock = threading.RLock()
        self._lines: dict[str, _Line] = {}
        self._redo: list[_Call] = []
        self._policy = _Reconnect(3, 1.0) if reconnect else _Reconnect()
        self._push_lock = threading.Lock()
        self._push_lines: dict[str, _Line] = {}
        self._pid = os.getpid()

    @property
    def prefix(self) -> str:
        """What every key of this queue starts with."""
        return self.keys.prefix

    @prefix.setter
    def prefix(self, prefix: str) -> None:
        self.keys = _Keys(prefix, self._topology.cluster)  # the key names (tagged per queue on a cluster)

    @property
    def client(self) -> Any:
        """The redis-py client this queue talks through (a ``RedisCluster`` on a cluster)."""
        return self._topology.client

    @property
    def _client(self) -> Any:
        return self._topology.client

    @property
    def cluster(self) -> bool:
        """Whether this queue is on a Redis Cluster."""
        return self._topology.cluster

    def describe(self) -> str:
        return f"redis {self._topology.describe()} prefix={self.prefix!r}"

    def _named(self) -> str:
        return f"redis connection {self.connection!r} ({self.describe()})"

    def _call(self, what: str, attempt: Callable[[], _T], broken: Callable[[], None] | None = None) -> _T:
        return _retrying(self._policy, self._named, what, attempt, broken, self._topology)

    def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` through the client (EVALSHA, by its text when not cached)."""
        client, script = self._client, self._scripts[name]
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(script.text, len(keys), *keys, *args)

    def _register(self, queues: Sequence[str]) -> None:
        """On a cluster, add ``queues`` to the queues set before their first job (once per process)."""
        if not self.cluster:
            return
        new = sorted(set(queues) - self._registered)
        if new:

            def register() -> None:
                for queue in new:  # new to the set: nothing of it its id index could lack (lua/ids.lua)
                    if self._client.sadd(self.keys.queues(), queue):
                        self._client.set(self.keys.base(queue) + "ids:whole", "1")

            self._call("dispatch", register)
            self._registered.update(new)

    def _queue_list(self) -> list[str]:
        names: Any = self._call("queue_names", lambda: self._client.smembers(self.keys.queues()))
        listed = {name.decode() for name in names}
        # on a cluster, the queues set lives on one node: what this process knows of counts too
        return sorted(listed | self._registered | {queue for queue, _ in self._streams_read})

    def _by_slot(self, items: Sequence[_T], queue_of: Callable[[_T], str]) -> list[list[_T]]:
        """``items`` in groups a script call may take together (every one on one server; per queue on a cluster)."""
        groups: dict[str, list[_T]] = {}
        for item in items:
            groups.setdefault(self.keys.slot(queue_of(item)), []).append(item)
        return list(groups.values())

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
        self._lines = {}
        self._push_lines = {}
        self._redo.clear()
        self._loop_lock = threading.RLock()
        self._push_lock = threading.Lock()
        self._topology.forked()

    # -- the owning loop's lines -------------------------------------------------------
    def _stamped(self, call: _Call) -> list[Any]:
        """``call``'s arguments as sent now: an ``adopt`` gets its deadline from this moment."""
        if call.name == "adopt":
            call.args[2] = _num(_clock.now() + self.reservation)
        return call.args

    def _send_deferred(self, calls: list[_Call]) -> None:
        """Send script calls on the loop lines without waiting: their replies are
        read before the next reply wanted there, and a call whose outcome is unknown is
        made again (each is harmless to repeat)."""
        self._after_fork()
        unsent = collections.deque(calls)
        with self._loop_lock:
            try:
                self._call("acknowledge", lambda: self._send_on_loop(unsent), self._loop_broken)
            finally:
                self._redo.extend(unsent)  # never sent: the next operation sends them

    def _send_on_loop(self, unsent: collections.deque[_Call]) -> None:
        self._fresh_lines()
        if self._redo:
            self._redo_calls()
        while unsent:
            # EVAL, not EVALSHA: a reply nobody may read before the process
            # exits must not be NOSCRIPT (a fresh server, a failover, SCRIPT FLUSH)
            call = unsent[0]
            line = self._line(call.keys[0])
            line.conn.send_command("EVAL", _SOURCES[call.name], len(call.keys), *call.keys, *self._stamped(call))
            line.sent.append(unsent.popleft())

    def _fresh_lines(self) -> None:
        """Drop lines opened before the sentinels announced a new master; what was
        sent on them unconfirmed goes again, to the new one."""
        generation = self._topology.generation
        for name, line in list(self._lines.items()):
            if line.generation != generation:
                self._drop_line(name)

    def _line(self, key: str) -> _Line:
        """The loop line to the server holding ``key``, connected: the arguments about
        to be built must be taken after any wait for a connection."""
        name, pool = self._topology.route(key)
        line = self._lines.get(name)
        if line is not None and line.pool is not pool:
            self._drop_line(name)  # the node was replaced in the slot map
            line = None
        if line is None:
            line = self._lines[name] = _Line(pool, pool.get_connection(), self._topology.generation)
        elif not line.sent:
            _drop_if_closed(line.conn)
        if line.conn._sock is None:
            line.conn.connect()
        return line

    def _drop_line(self, name: str) -> None:
        line = self._lines.pop(name)
        self._redo.extend(line.sent)
        line.sent.clear()
        line.conn.disconnect()
        line.pool.release(line.conn)

    def _loop_broken(self) -> None:
        """A loop line failed: drop them all; calls not confirmed go again."""
        for name in list(self._lines):
            self._drop_line(name)

    def _read_sent(self, line: _Line) -> None:
        """Read the replies of calls sent earlier on ``line`` (in order, before any later reply)."""
        while line.sent:
            try:
                reply = line.conn.read_response()
            except _AGAIN:
                raise  # it did not run: the line is dropped and the call goes again
            except redis.ResponseError:
                # OOM under noeviction...: sent again by the next operation
                self._redo.append(line.sent.popleft())
                continue
            call = line.sent.popleft()
            if call.reply is not None:
                call.reply.append(reply)

    def _redo_calls(self) -> None:
        """Send again, one at a time, the deferred calls whose outcome is unknown."""
        while self._redo:
            call = self._redo[0]
            line = self._line(call.keys[0])
            self._read_sent(line)
            line.conn.send_command("EVAL", _SOURCES[call.name], len(call.keys), *call.keys, *self._stamped(call))
            reply = line.conn.read_response()
            self._redo.pop(0)
            if call.reply is not None:
                call.reply.append(reply)

    def _confirm(self) -> None:
        self._fresh_lines()
        for line in list(self._lines.values()):
            self._read_sent(line)
        self._redo_calls()

    def _sync(self) -> None:
        """Confirm every call sent so far (called before other operations, to keep order)."""
        self._after_fork()
        if not self._redo and not any(line.sent for line in self._lines.values()):
            return
        with self._loop_lock:
            self._call("acknowledge", self._confirm, self._loop_broken)

    def _on_loop_connection(self, script: str, keys: list[str], args: Callable[[], list[Any]]) -> Any:
        """Run ``script`` on the loop line of the server holding ``keys``, reading unread
        replies there on the way; ``args`` builds its arguments as it is sent, again for each try."""
        self._after_fork()
        with self._loop_lock:
            return self._call(script, lambda: self._on_loop(script, keys, args), self._loop_broken)

    def _on_loop(self, script: str, keys: list[str], args: Callable[[], list[Any]]) -> Any:
        self._fresh_lines()
        if self._redo:
            self._redo_calls()
        line = self._line(keys[0])
        conn = line.conn
        conn.send_command("EVALSHA", self._scripts[script].sha, len(keys), *keys, *args())
        self._read_sent(line)
        try:
            return conn.read_response()
        except redis.exceptions.NoScriptError:
            pass
        # not cached (a fresh server, a failover, SCRIPT FLUSH): by its text, which caches it
        conn.send_command("EVAL", _SOURCES[script], len(keys), *keys, *args())
        return conn.read_response()

    # -- the producers' lines -----------------------------------------------------------
    def _on_push_connection(self, script: str, calls: list[_Call]) -> None:
        """Run ``script`` once per call (each with "now" first in its arguments, filled
        in as it is sent), pipelined on the producers' own connection to each server: a
        dispatch skips the pool's checkout (a third of its cost). A second thread
        dispatching meanwhile takes pooled connections instead."""
        self._after_fork()
        pending = list(calls)
        if self._push_lock.acquire(blocking=False):
            try:
                self._call("dispatch", lambda: self._push(script, pending, own=True))
            finally:
                self._push_lock.release()
            return
        self._call("dispatch", lambda: self._push(script, pending, own=False))

    def _push(self, script: str, pending: list[_Call], own: bool) -> None:
        groups: dict[str, tuple[Any, list[_Call]]] = {}
        for call in pending:
            name, pool = self._topology.route(call.keys[0])
            groups.setdefault(name, (pool, []))[1].append(call)
        for name, (pool, calls) in groups.items():
            if own:
                self._push_on(self._push_connection(name, pool), script, calls, pending)
                continue
            conn = pool.get_connection()
            try:
                self._push_on(conn, script, calls, pending)
            finally:
                pool.release(conn)

    def _push_connection(self, name: str, pool: Any) -> Any:
        line = self._push_lines.get(name)
        if line is not None and (line.pool is not pool or line.generation != self._topology.generation):
            del self._push_lines[name]
            line.conn.disconnect()
            line.pool.release(line.conn)
            line = None
        if line is None:
            line = self._push_lines[name] = _Line(pool, pool.get_connection(), self._topology.generation)
        else:
            _drop_if_closed(line.conn)
        return line.conn

    def _push_on(self, conn: Any, script: str, calls: list[_Call], pending: list[_Call]) -> None:
        """Send every call in ``calls``, then read every reply. A call leaves
        ``pending`` once its reply is read, so a retry sends only the unanswered
        ones; every reply is read, also after an error, since one left unread would
        be taken by the next dispatch on this connection as its own."""
        if conn._sock is None:
            conn.connect()
        command: tuple[str, str] = ("EVALSHA", self._scripts[script].sha)
        error: redis.ResponseError | None = None
        try:
            todo = calls
            while todo:
                now = _num(_clock.now())
                for call in todo:
                    call.args[0] = now
                    conn.send_command(*command, len(call.keys), *call.keys, *call.args)
                unloaded: list[_Call] = []
                for call in todo:
                    try:
                        conn.read_response()
                    except redis.exceptions.NoScriptError:
                        unloaded.append(call)
                        continue
                    except _AGAIN as exc:  # it did not run: still pending, for the next try
                        error = error if error is not None and not isinstance(error, _AGAIN) else exc
                        continue
                    except redis.ResponseError as exc:
                        if error is None or isinstance(error, _AGAIN):
                            error = exc
                    pending.remove(call)
                todo = unloaded
                # not cached (a fresh server, SCRIPT FLUSH): by its text
                command = ("EVAL", _SOURCES[script])
        except BaseException:
            conn.disconnect()  # with any reply on it unread
            raise
        if isinstance(error, ReadOnlyError):
            conn.disconnect()  # a replica now: the next try connects afresh (resolving the name again)
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
            return [_GROUP, band, entry, failed_id, record, _num(now), "0"]

        self._on_loop_connection("fail", self._fail_keys(queue, band), args)
        log.error("queue %r: discarded unreadable stream entry %s: %s", queue, entry.decode(), info.error)
        self.announce_discarded(info, raw)

    def _put_back(self, job: QueuedJob, delay: float, attempts: int) -> None:
        receipt = _receipt(job)
        if receipt is None:
            return
        delay = max(0.0, float(delay))

        keys, queue = self.keys, receipt.queue
        release_keys = [
            keys.stream(queue, receipt.band),
            keys.reserved(queue),
            keys.bands(queue),
            keys.delayed(queue),
            keys.wake_sent(queue),
        ]

        def args() -> list[Any]:
            now = _clock.now()
            return [
                _GROUP,
                receipt.band,
                receipt.entry,
                _num(now),
                _num(now + delay),
                str(attempts),
                receipt.body,
                keys.channel(),
            ]

        self._on_loop_connection("release", release_keys, args)

    def _fail_keys(self, queue: str, band: bytes) -> list[str]:
        keys = self.keys
        return [keys.stream(queue, band), keys.reserved(queue), keys.failed(queue), keys.failed_index(queue)]
