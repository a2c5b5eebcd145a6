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

The parts: :mod:`.wire` (how jobs, entries and records are written and read),
:mod:`.core` (the client and the connections scripts run on), :mod:`.reading`
(idle waits: wake-up notifications and blocking reads), :mod:`.session` (an
owning loop's consumer operations), :mod:`.failed` (the failed store) and
:mod:`.browse` (listing the jobs stored); :class:`RedisQueue` composes them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from ... import _clock
from ...errors import DriverUnavailableError, RedisUnavailableError
from ...types import (
    ExceptionInfo,
    FailedJob,
    QueueCounts,
    QueuedJob,
    as_exception_info,
)
from ..base import Capabilities, Promises, QueueDriver, as_job_list
from .browse import _Browsing
from .connection import _check_url, _client, _connection_settings
from .core import _consumer_name
from .failed import _FailedStore
from .reading import _IdleReading
from .session import RedisSession
from .wire import _CHUNK, _GROUP, _PROMOTE, _blob, _num, _push_args, _receipt, _record

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

__all__ = ["RedisQueue", "RedisUnavailableError"]

log = logging.getLogger("rainier_sync")


class RedisQueue(_IdleReading, _FailedStore, _Browsing):
    """Jobs in Redis streams, read through one consumer group.

    Fast, and it can lose an accepted job (snapshot persistence, asynchronous
    replication, eviction): see the Redis driver's documentation before
    choosing it. Build it with :meth:`from_url`, or hand it a ``redis.Redis``
    client (``protocol=2``, ``decode_responses=False``).
    """

    driver = QueueDriver.REDIS
    promises = Promises.of(QueueDriver.REDIS)
    capabilities = Capabilities(give_back=True, wakes=True, eviction_check=True, listing=True)

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

    def open_session(self) -> RedisSession:
        """One owning loop's consumer operations, with its own wake-ups and blocking read."""
        return RedisSession(self)

    # -- producing -------------------------------------------------------------
    def push(self, job: QueuedJob) -> str:
        self._on_push_connection("push_one", [[self.prefix, None, *_push_args(job)]])
        return job.id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Store ``jobs`` in one pipeline (one script call per thousand jobs)."""
        if not jobs:
            return []
        chunks: list[list[Any]] = [
            [self.prefix, None, _blob(jobs[start : start + _CHUNK])] for start in range(0, len(jobs), _CHUNK)
        ]
        self._on_push_connection("push", chunks)
        return [job.id for job in jobs]

    # -- consuming -------------------------------------------------------------
    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        """XACK and XDEL every job's entry, grouped per stream, in one script call per thousand."""
        streams: dict[tuple[str, bytes], list[bytes]] = {}
        for job in jobs:
            receipt = _receipt(job)
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

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        self._put_back(job, delay, job.attempts)

    def give_back(self, jobs: Sequence[QueuedJob]) -> None:
        """Unstarted jobs go back on their stream at once, their attempt uncounted."""
        for job in jobs:
            self._put_back(job, 0.0, max(0, job.attempts - 1))

    def defer(self, job: QueuedJob, delay: float) -> None:
        """Back to the delayed set, due in ``delay`` seconds, its attempt uncounted."""
        self._put_back(job, delay, max(0, job.attempts - 1))

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        info = as_exception_info(error)
        wire, details = job.to_wire(), info.to_dict()
        receipt = _receipt(job)
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
            receipt = _receipt(job)
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

    def close(self) -> None:
        self._after_fork()
        self._end_reads()
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
        self._close_subscription()
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
