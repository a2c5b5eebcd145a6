"""The Redis driver's idle waits: wake-up notifications and blocking reads.

An idle loop waits on a subscription to ``P + "wake"`` (a push, release,
retry or reclaim publishes there: :mod:`.wakeups`), and also blocks in ``XREADGROUP`` on a
connection of its own (one per owning loop), so a job pushed to a stream it
reads reaches it with the push, not a round trip after the notification. What
that read takes waits in the loop's stash for its next reserve.

On Redis Cluster one ``XREADGROUP`` may only name keys of one slot, so the
blocking read covers the first of the loop's queues that has a stream; the
others wake it by notification.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Sequence
from typing import Any

from ... import _clock
from ...errors import DriverUnavailableError
from ...types import QueuedJob
from ..base import Waker
from .connection import LONGEST_BLOCK
from .core import _Call
from .wakeups import _WakeUps
from .wire import _GROUP, _PROMOTE, _num, _Taken

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

log = logging.getLogger("rainier_sync")


class _IdleRead:
    """One owning loop's blocking read: its connection, the streams an outstanding
    read covers (None when none is outstanding), and what it took."""

    __slots__ = ("conn", "pool", "generation", "client_id", "streams", "sent_at", "stash", "lock")

    def __init__(self) -> None:
        self.conn: Any = None
        self.pool: Any = None
        self.generation = 0
        self.client_id = 0
        self.streams: dict[bytes, tuple[str, bytes]] | None = None
        self.sent_at = 0.0
        self.stash: list[_Taken] = []
        self.lock = threading.Lock()


class _LoopState:
    """One owning loop's part of the idle machinery: the wake-up count its last
    reserve saw, and its blocking read (made on first use)."""

    __slots__ = ("seq", "read", "generation")

    def __init__(self, generation: int) -> None:
        self.seq = -1
        self.read: _IdleRead | None = None
        #: The driver's fork generation the read belongs to.
        self.generation = generation


class _IdleReading(_WakeUps):
    """Idle waits, and handing out what a loop's blocking read took."""

    def __init__(
        self,
        client: Any,
        prefix: str = "rainier:queue:",
        reservation: float = 90,
        *,
        consumer: str | None = None,
        reconnect: bool = False,
    ) -> None:
        super().__init__(client, prefix, reservation, consumer=consumer, reconnect=reconnect)
        # Each owning loop has its own _LoopState (in its session; per thread for
        # consumer operations called on the driver itself): two workers on one
        # driver must not consume each other's notifications.
        self._loops = threading.local()
        self._generation = 0
        self._all_reads: set[_IdleRead] = set()
        self._blocking_reads = True

    def _forked(self) -> None:
        super()._forked()
        self._generation += 1  # every loop's blocking read is the parent's
        self._all_reads = set()

    def _loop_state(self) -> _LoopState:
        """The calling thread's loop state, for consumer operations called on the driver itself."""
        state: _LoopState | None = getattr(self._loops, "state", None)
        if state is None:
            state = self._loops.state = _LoopState(self._generation)
        return state

    def _current(self, state: _LoopState) -> None:
        """In a forked child, a loop's blocking read is its parent's: forget it (``_after_fork`` first)."""
        if state.generation != self._generation:
            state.generation, state.read = self._generation, None

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return self._reserve(self._loop_state(), queues, limit)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Sleep until a job may be there for ``queues`` — this loop's blocking read of
        their streams took one, or a push, release or reclaim notified — until the
        soonest delayed job is due, ``waker`` is set, or ``timeout`` passes."""
        self._wait(self._loop_state(), queues, timeout, waker)

    # -- handing out what a blocking read took -------------------------------------------
    def _reserve(self, state: _LoopState, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        if isinstance(queues, str):
            queues = [queues]
        if limit <= 0 or not queues:
            return []
        self._after_fork()
        self._current(state)
        state.seq = self._wake_seq
        read = state.read
        if read is not None and (read.stash or read.streams is not None):
            stashed = self._take_stash(read, queues, limit)
            if stashed:
                return stashed  # at once: the caller reserves again for the rest, and this is its idle wake-up
        jobs: list[QueuedJob] = []
        for group in self._by_slot(list(dict.fromkeys(queues)), lambda queue: queue):
            left = limit - len(jobs)
            if left <= 0:
                break
            jobs += self._reserve_from(group, left)
        return jobs

    def _reserve_from(self, queues: list[str], limit: int) -> list[QueuedJob]:
        """One reserve script over ``queues`` (every queue on one server, one on a cluster)."""
        keys, consumer, reservation = self.keys, self.consumer, self.reservation
        names = [keys.wake_sent(queues[0])]
        for queue in queues:
            names += keys.queue_keys(queue)

        def args() -> list[Any]:
            now = _clock.now()
            return [_GROUP, consumer, _num(now), _num(now + reservation), int(limit), _PROMOTE, *queues]

        return self._jobs_from(self._on_loop_connection("reserve", names, args))

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
                self._send_deferred(self._adopt_calls(fresh))
            except BaseException:
                with read.lock:
                    read.stash[:0] = fresh
                raise
        return self._taken_jobs(fresh + older)

    def _taken_jobs(self, items: Sequence[_Taken]) -> list[QueuedJob]:
        return self._jobs_from((queue.encode(), band, [(entry, fields)]) for queue, band, entry, fields, _ in items)

    def _adopt_calls(self, items: Sequence[_Taken]) -> list[_Call]:
        """The ``adopt`` script's calls (one per slot); the deadline (None here) is filled in as each is sent."""
        calls: list[_Call] = []
        keys = self.keys
        for group in self._by_slot(items, lambda item: item[0]):
            call = _Call("adopt", [], [_GROUP, self.consumer, None])
            for queue, band, entry, _, _ in group:
                call.keys += [keys.stream(queue, band), keys.reserved(queue)]
                call.args += [band, entry]
            calls.append(call)
        return calls

    def _adopt(self, items: Sequence[_Taken]) -> list[bytes]:
        """Record the reservations of what the blocking read took that is still this
        consumer's; returns their entry ids."""
        taken: list[bytes] = []
        for call in self._adopt_calls(items):
            taken += self._on_loop_connection("adopt", call.keys, lambda call=call: self._stamped(call))  # type: ignore[misc]
        return taken

    # -- waiting -------------------------------------------------------------------
    def _wait(self, state: _LoopState, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """What :meth:`wait_for_jobs` does, for the loop ``state`` belongs to."""
        self._sync()
        self._current(state)
        with self._mutex:
            self._waiters.add(waker)
            notified = self._wake_seq != state.seq
        try:
            if notified:
                return
            if self._closed.is_set():
                waker.wait(timeout)
                return
            self._topology.check()
            self._follow_master(state)
            # Subscribe (or notice a dropped subscription) before looking for the
            # soonest delayed job, so a push in between is seen by one or the other.
            subscription = self._subscription()
            if subscription is not None and self._drain(subscription):
                return  # notified, or just subscribed: what was published before is unknown

            keys = self.keys

            def look() -> Any:
                pipe = self._client.pipeline(transaction=False)
                for queue in queues:
                    pipe.zrange(keys.delayed(queue), 0, 0, withscores=True)
                    pipe.zrange(keys.bands(queue), 0, -1)
                return pipe.execute()

            replies = self._call("wait_for_jobs", look)
            soonest = min((rows[0][1] for rows in replies[0::2] if rows), default=None)
            if soonest is not None:
                timeout = min(timeout, max(0.0, float(soonest) - _clock.now()))
            streams = [(queue, band) for queue, bands in zip(queues, replies[1::2], strict=True) for band in bands]
            if self.cluster and streams:
                # one XREADGROUP names keys of one slot: the first queue with a stream
                streams = [stream for stream in streams if stream[0] == streams[0][0]]
            read = self._idle_read(state)
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

    def _follow_master(self, state: _LoopState) -> None:
        """After the sentinels announced a new master: leave the old one's
        subscription and this loop's blocking read (what it took is not pending
        on the new master: it is handed out again there)."""
        generation = self._topology.generation
        read = state.read
        if read is not None and read.conn is not None and read.generation != generation:
            with read.lock:  # what it took is checked against the new master as it is handed out
                self._drop_read(read, ConnectionError("a new master"))
        self._follow_subscription()

    def _idle_read(self, state: _LoopState) -> _IdleRead:
        """An owning loop's blocking-read state (made on first use)."""
        read = state.read
        if read is None:
            read = state.read = _IdleRead()
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
            sentinel = self._topology.watch_socket()
            if sentinel is not None:
                watched.append(sentinel)
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
            if sentinel is not None and sentinel in readable:
                generation = self._topology.generation
                self._topology.check()
                if self._topology.generation != generation:
                    return  # a new master: the next wait reads and listens there
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
        It ends by itself within a second (:data:`.LONGEST_BLOCK`), so a read nobody
        collects lapses soon; its reply is read only once it has come, so no
        response timeout cuts it off."""
        keys = [self.keys.stream(queue, band) for queue, band in streams]
        if read.conn is not None and (read.pool is not self._topology.route(keys[0])[1]):
            self._drop_read(read, ConnectionError("its streams are on another node"))
        if read.conn is None:
            try:
                pool = self._topology.route(keys[0])[1]
                conn: Any = pool.get_connection()
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.debug("redis blocking read: %s; waiting on notifications until the next wait", exc)
                return
            try:
                conn.send_command("CLIENT", "ID")
                read.client_id = int(conn.read_response())
            except redis.ResponseError as exc:  # CLIENT refused (an ACL, a renamed command)
                pool.release(conn)
                self._blocking_reads = False
                log.warning("redis: idle workers wait on notifications only (CLIENT ID refused: %s)", exc)
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                conn.disconnect()
                pool.release(conn)
                log.debug("redis blocking read: %s; waiting on notifications until the next wait", exc)
                return
            read.conn, read.pool, read.generation = conn, pool, self._topology.generation
        block_ms = max(1, int(min(seconds, LONGEST_BLOCK) * 1000))
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
            # (MOVED, UNBLOCKED by a master turned replica...: the connection goes too.)
            log.debug("redis blocking read refused: %s", exc)
            read.streams = None
            if not str(exc).startswith("NOGROUP"):
                self._drop_read(read, exc)
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
            read.pool.release(conn)

    def _end_loop(self, state: _LoopState) -> None:
        """End the blocking read a stopping loop left outstanding, and hand back what it took."""
        self._after_fork()
        self._current(state)
        read, state.read = state.read, None
        if read is not None:
            self._end_read(read)

    def _end_read(self, read: _IdleRead) -> None:
        """End an outstanding blocking read and hand back, unstarted and uncounted,
        whatever it took that is still this consumer's."""
        with self._mutex:
            self._all_reads.discard(read)
        with read.lock:
            if read.streams is not None and read.conn is not None:
                try:
                    redis.Redis(connection_pool=read.pool).client_unblock(read.client_id)
                except Exception as exc:  # noqa: BLE001 - it ends by itself within a second
                    log.debug("redis: CLIENT UNBLOCK refused (%s); waiting for the read to end", exc)
                self._collect(read, 2.0)
                if read.streams is not None:
                    self._drop_read(read, TimeoutError("the blocking read did not end"))
            if read.conn is not None:
                read.pool.release(read.conn)
                read.conn = None
            stash, read.stash = read.stash, []
        if not stash:
            return
        still = set(self._adopt(stash))
        for job in self._taken_jobs([item for item in stash if item[2] in still]):
            self._put_back(job, 0.0, max(0, job.attempts - 1))

    def _end_reads(self) -> None:
        """Stop new blocking reads, end every outstanding one and hand back what they took."""
        self._closed.set()  # first: no loop sends a new blocking read while the old ones end
        with self._mutex:
            reads = list(self._all_reads)
        for read in reads:
            try:
                self._end_read(read)
            except Exception as exc:  # noqa: BLE001 - closing: what the read took lapses and runs again
                log.warning("redis queue closing: could not hand back what a blocking read took: %s", exc)
