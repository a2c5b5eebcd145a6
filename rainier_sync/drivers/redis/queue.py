"""The Redis driver: streams read through one consumer group.

Keys, under the connection's ``prefix`` ``P`` (on Redis Cluster, ``P{<queue>}:…``
instead of ``P<queue>:…``, and the failed store per queue: see :mod:`.keys`):

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
:mod:`.keys` (the key names), :mod:`.targets` and :mod:`.topology` (what a URL
points at: one server, Sentinel, a cluster; where a key's commands go),
:mod:`.core` (the client and the connections scripts run on), :mod:`.wakeups`
and :mod:`.reading` (idle waits: wake-up notifications and blocking reads),
:mod:`.session` (an owning loop's consumer operations), :mod:`.counting` (the
jobs of batches counted with their acknowledgements), :mod:`.failed` (the
failed store) and :mod:`.browse` (listing the jobs stored); :class:`RedisQueue`
composes them.
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
from ..base import Capabilities, QueueDriver, as_job_list
from ..extensions import CountsBatches, LendsLocks, ListsJobs
from .browse import _Browsing
from .connection import _connection_settings
from .core import _Call, _consumer_name
from .counting import _Counting
from .failed import _FailedStore
from .session import RedisSession
from .spec import PROMISES
from .store import RedisLockStore, lock_prefix
from .targets import _target
from .topology import _Topology
from .wire import _CHUNK, _GROUP, _PROMOTE, _blob, _num, _push_args, _receipt, _record

try:
    import redis
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

__all__ = ["RedisQueue", "RedisUnavailableError"]

log = logging.getLogger("rainier_sync")


class RedisQueue(_Counting, _FailedStore, _Browsing, CountsBatches, ListsJobs, LendsLocks):
    """Jobs in Redis streams, read through one consumer group.

    Fast, and it can lose an accepted job (snapshot persistence, asynchronous
    replication, eviction): see the Redis driver's documentation before
    choosing it. Build it with :meth:`from_url`, or hand it a ``redis.Redis``
    client (``protocol=2``, ``decode_responses=False``; one from a Sentinel's
    ``master_for`` too) or a ``redis.cluster.RedisCluster``.
    """

    driver = QueueDriver.REDIS
    promises = PROMISES
    capabilities = Capabilities(
        give_back=True, wakes=True, eviction_check=True, listing=True, counts_batches=True, lends_locks=True
    )
    #: One script call stores a queue's chunk whole; a pipeline of several may stop part way.
    atomic_batch = _CHUNK

    @classmethod
    def from_url(
        cls,
        url: str | None,
        prefix: str = "rainier:queue:",
        reservation: float = 90,
        connect_timeout_ms: float | None = None,
        response_timeout_ms: float | None = None,
        reconnect: bool = False,
        reconnect_attempts: int | None = None,
        reconnect_max_backoff_ms: float | None = None,
        *,
        sentinels: Sequence[str] | str | None = None,
        service_name: str | None = None,
    ) -> RedisQueue:
        """Build a queue on ``url`` (``redis://host:port/db``: the database index is the queue's own).

        ``redis+sentinel://h1:26379,h2:26379/SERVICE/DB`` is the master the
        sentinels name for ``SERVICE`` (followed through a failover), and
        ``redis+cluster://h1:7000,h2:7001`` a Redis Cluster. ``sentinels``
        (``host:port`` each) and ``service_name`` say the same as the first form;
        ``url`` then gives at most the database and credentials (``redis:///1``).

        ``connect_timeout_ms`` bounds opening a connection and ``response_timeout_ms``
        each reply, 5000 ms each unless given (an idle worker's blocking reads are not
        cut off by it). With ``reconnect`` a command that meets a dropped, refused or
        timed-out connection is sent again on a new one, up to ``reconnect_attempts``
        (default 3) more times, pausing 100 ms, 200 ms, 400 ms... (at most
        ``reconnect_max_backoff_ms``, default 1000) in between, its times ("now",
        deadlines) taken afresh for each try. When every try fails, or without
        ``reconnect`` the first, it raises :class:`RedisUnavailableError` naming the
        connection (the worker reports it as ``queue_operation_failed``). A database
        index the server does not have raises
        :class:`~rainier_sync.errors.ConfigurationError` at the first command, untried again.
        """
        target = _target("redis connection", url, sentinels, service_name)
        connect_timeout, response_timeout, policy = _connection_settings(
            "redis connection",
            connect_timeout_ms,
            response_timeout_ms,
            reconnect,
            reconnect_attempts,
            reconnect_max_backoff_ms,
        )
        consumer = _consumer_name()
        topology = _Topology(target, connect_timeout, response_timeout, f"rainier-queue-{consumer}")
        queue = cls(topology, prefix=prefix, reservation=reservation, consumer=consumer, reconnect=reconnect)
        queue._policy = policy
        return queue

    def open_session(self) -> RedisSession:
        """One owning loop's consumer operations, with its own wake-ups and blocking read."""
        return RedisSession(self)

    def lock_store(self) -> RedisLockStore:
        """A store on this queue's own client (server, database, Sentinel or cluster)
        and reconnect settings, under :func:`~.store.lock_prefix` of the queue's prefix:
        the same client, so the queue counts batches in its acknowledgements (see
        :mod:`.counting`), and no second pool."""
        store = RedisLockStore(self._topology, prefix=lock_prefix(self.prefix))
        store._policy = self._policy
        return store

    # -- producing -------------------------------------------------------------
    def push(self, job: QueuedJob) -> str:
        args = _push_args(job)  # refuses what cannot be stored before anything is sent
        queue, keys = job.queue, self.keys
        names = [keys.bands(queue), keys.delayed(queue), keys.wake_sent(queue)]
        if self.cluster:
            self._register([queue])
        else:
            names.append(keys.queues())
        self._on_push_connection("push_one", [_Call("push_one", names, [None, *args, keys.channel()])])
        return job.id

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Store ``jobs`` in one pipeline (one script call per thousand jobs; on a
        cluster, per thousand jobs of one queue)."""
        if not jobs:
            return []
        calls: list[_Call] = []
        for group in self._by_slot(jobs, lambda job: job.queue):
            for start in range(0, len(group), _CHUNK):
                calls.append(self._push_call(group[start : start + _CHUNK]))
        self._register([job.queue for job in jobs])
        self._on_push_connection("push", calls)
        return [job.id for job in jobs]

    def _push_call(self, jobs: Sequence[QueuedJob]) -> _Call:
        blob = _blob(jobs)
        keys = self.keys
        queues = list(dict.fromkeys(job.queue for job in jobs))
        names = [keys.wake_sent(queues[0])]
        if not self.cluster:
            names.append(keys.queues())
        for queue in queues:
            names += [keys.bands(queue), keys.delayed(queue)]
        return _Call("push", names, [None, keys.channel(), "0" if self.cluster else "1", *queues, blob])

    # -- consuming -------------------------------------------------------------
    def acknowledge(self, job: QueuedJob) -> None:
        self.acknowledge_many([job])

    def acknowledge_many(self, jobs: Sequence[QueuedJob]) -> None:
        """XACK and XDEL every job's entry, grouped per stream, in one script call per
        thousand (which also forgets each job's id in the queue's id index)."""
        streams: dict[tuple[str, bytes], tuple[list[bytes], list[str]]] = {}
        for job in jobs:
            receipt = _receipt(job)
            if receipt is not None:
                held = streams.get((receipt.queue, receipt.band))
                if held is None:
                    held = streams[(receipt.queue, receipt.band)] = ([], [])
                held[0].append(receipt.entry)
                held[1].append(job.id)
        if not streams:
            return
        keys = self.keys
        calls: list[_Call] = []
        for group in self._by_slot(list(streams.items()), lambda item: item[0][0]):
            call = _Call("ack", [], [_GROUP])
            count = 0
            for (queue, band), (entries, ids) in group:
                for start in range(0, len(entries), _CHUNK):
                    part = entries[start : start + _CHUNK]
                    if count + len(part) > _CHUNK and count:
                        calls.append(call)
                        call, count = _Call("ack", [], [_GROUP]), 0
                    call.keys += [keys.stream(queue, band), keys.reserved(queue)]
                    call.args.extend((band, len(part), *part, *ids[start : start + _CHUNK]))
                    count += len(part)
            calls.append(call)
        self._send_deferred(calls)

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
            return [_GROUP, band, entry, job.id, _record(record), _num(failed_at), held]

        self._on_loop_connection("fail", self._fail_keys(queue, band), args)
        return FailedJob.of(job, info, failed_at)

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        """Push running jobs' deadlines out and re-claim their entries for this consumer
        (``XCLAIM ... JUSTID``), so neither sweep takes them from a live worker."""
        receipts = [receipt for receipt in map(_receipt, as_job_list(jobs)) if receipt is not None]
        if not receipts:
            return
        period = self.reservation if seconds is None else float(seconds)
        if not math.isfinite(period):
            raise ValueError(f"{self._named()}: extend: seconds must be a finite number, got {seconds!r}")
        keys = self.keys
        for group in self._by_slot(receipts, lambda receipt: receipt.queue):
            names: list[str] = []
            held: list[Any] = []
            for receipt in group:
                names += [keys.stream(receipt.queue, receipt.band), keys.reserved(receipt.queue)]
                held += [receipt.band, receipt.entry]

            def args(held: list[Any] = held) -> list[Any]:
                return [_GROUP, self.consumer, _num(_clock.now() + period), *held]

            self._on_loop_connection("extend", names, args)

    def reclaim_expired(self) -> int:
        """Put every job whose reservation lapsed back on its queue; returns how many.

        Also forgets group consumers (worker processes) that hold nothing and have
        not been heard from for ten reservations."""
        reservation_ms = int(self.reservation * 1000)
        keys = self.keys
        reclaimed = 0
        for group in self._by_slot(self._queue_list(), lambda queue: queue):
            names = [keys.wake_sent(group[0])]
            for queue in group:
                names += [keys.bands(queue), keys.reserved(queue)]

            def args() -> list[Any]:
                now = _num(_clock.now())
                forget = 10 * reservation_ms
                return [_GROUP, self.consumer, now, reservation_ms, _PROMOTE, forget, keys.channel()]

            reclaimed += int(self._on_loop_connection("reclaim", names, args))
        return reclaimed

    # -- inspection -------------------------------------------------------------
    def counts(self, queue: str) -> QueueCounts:
        self._sync()
        names = self.keys.queue_keys(queue)
        ready, delayed, reserved = self._call("counts", lambda: self._run("counts", names, [_num(_clock.now())]))
        return QueueCounts(ready=max(0, int(ready)), delayed=int(delayed), reserved=int(reserved))

    def size(self, queue: str | None = None) -> int:
        queues = [queue] if queue is not None else self.queue_names()
        return sum(self.counts(name).total for name in queues)

    def queue_names(self) -> list[str]:
        names: Any = self._call("queue_names", lambda: self._client.smembers(self.keys.queues()))
        return sorted(name.decode() for name in names)

    def check_eviction_policy(self) -> str | None:
        """Read ``maxmemory-policy``; log a warning unless it is ``noeviction``.

        Returns the policy, or None when the server will not say (``CONFIG`` disabled).
        """
        try:
            replies: Any = self._call("check_eviction_policy", self._eviction_policies)
        except redis.ResponseError as exc:
            log.warning("could not read Redis maxmemory-policy (%s); make sure it is noeviction", exc)
            return None
        policy = "noeviction"
        for where, reply in replies:
            value = reply.get(b"maxmemory-policy", reply.get("maxmemory-policy"))
            found = value.decode() if isinstance(value, bytes) else str(value)
            if found != "noeviction":
                policy = found
                log.warning(
                    "Redis%s maxmemory-policy is %r: under memory pressure Redis may evict this queue's keys and "
                    "lose jobs silently; set maxmemory-policy noeviction",
                    f" node {where}" if where else "",
                    found,
                )
        return policy

    def _eviction_policies(self) -> list[tuple[str, Any]]:
        """``CONFIG GET maxmemory-policy`` of the server, or of every primary of a cluster."""
        client = self._client
        if not self.cluster:
            return [("", client.config_get("maxmemory-policy"))]
        nodes = client.get_primaries()
        return [(node.name, client.get_redis_connection(node).config_get("maxmemory-policy")) for node in nodes]

    def close(self) -> None:
        self._after_fork()
        self._end_reads()
        try:
            self._sync()
        except Exception as exc:  # noqa: BLE001 - closing: their reservations lapse and they run again
            log.warning("redis queue closing: %d acknowledgement(s) unconfirmed: %s", self._unconfirmed(), exc)
        with self._loop_lock:
            lines, self._lines = list(self._lines.values()), {}
        with self._push_lock:
            lines += self._push_lines.values()
            self._push_lines = {}
        for line in lines:
            line.pool.release(line.conn)
        self._close_subscription()
        try:
            self._forget_consumer()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self._topology.close()

    def _unconfirmed(self) -> int:
        return len(self._redo) + sum(len(line.sent) for line in self._lines.values())

    def _forget_consumer(self) -> None:
        """Remove this consumer from the groups it read from, where it holds nothing."""
        for queue, band in self._streams_read:
            stream = self.keys.stream(queue, band)
            try:
                consumers: Any = self._client.xinfo_consumers(stream, _GROUP)
                for consumer in consumers:
                    name = consumer.get("name", consumer.get(b"name"))
                    name = name.decode() if isinstance(name, bytes) else name
                    if name == self.consumer and int(consumer.get("pending", 0)) == 0:
                        self._client.xgroup_delconsumer(stream, _GROUP, self.consumer)
            except redis.ResponseError:
                continue
