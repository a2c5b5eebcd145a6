"""The Redis store of the coordination state: unique-job locks, Kafka's job
leases, job middleware's windows, counters and flags (paused queues), results,
batches' tallies and the workers' records, shared by every process that names
the same Redis.

Keys, under the store's ``prefix`` ``P``: ``P<key>`` a lock (its owner token,
expiring by ``PX``); ``Pwindow:<key>`` a sliding window (sorted set of batches of starts);
``Pcount:<key>`` a counter (hash); ``Pflags:<group>`` a set of raised flags;
``Pvalue:<key>`` a kept value (a job's result) and ``Pvalue:<key>:ready`` its wake-up list;
``Ptally:<key>`` a tally's counts and ``Ptally:<key>:members`` the members settled.

On Redis Cluster the keys one script or transaction touches together (a
tally's pair, a value's pair) carry the key as a hash tag, ``Ptally:{<key>}``,
so they share a slot; everything else is one key per call there too.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ... import _clock
from ...errors import ConfigurationError
from ...state.base import ROOMS, StateStore, last_counts
from .connection import _connection_settings, _ours, _Reconnect, _retrying
from .scripts import source
from .targets import _target
from .topology import _Topology

if TYPE_CHECKING:
    import redis

__all__ = ["RedisLockStore", "lock_prefix"]

_T = TypeVar("_T")
#: Past its window, an idle window or count is kept this long before Redis drops it,
#: so that a clock moved by freezegun still finds it.
_IDLE_KEEP = 3600.0


def _keep_ms(seconds: float) -> int:
    return int((float(seconds) + _IDLE_KEEP) * 1000)


def lock_prefix(queue_prefix: str) -> str:
    """The prefix of the store a Redis queue with ``queue_prefix`` defaults to:
    its last ``queue:`` made ``lock:``, or ``lock:`` added to a prefix that has none."""
    head, found, tail = queue_prefix.rpartition("queue:")
    if found and not tail:
        return head + "lock:"
    return queue_prefix + "lock:"


def _ttl_ms(ttl: float, key: str) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
        raise ValueError(f"lock {key!r}: ttl must be a positive number of seconds, got {ttl!r}")
    return max(1, int(round(ttl * 1000)))


class RedisLockStore(StateStore):
    """Locks in Redis: ``SET key owner NX PX ttl``; released and renewed only by their owner token.

    Expiry is Redis's own clock (``PX``), so a lock outlives a dead holder by at most its ttl.
    Usable with any queue driver. Redis out of reach raises :class:`RedisUnavailableError`.
    Takes a ``redis.Redis`` (one from a Sentinel's ``master_for`` too) or a ``RedisCluster``.
    """

    def __init__(self, client: redis.Redis | Any, prefix: str = "rainier:lock:") -> None:
        self._topology = client if isinstance(client, _Topology) else _Topology.of(client)
        if self._topology.cluster and ("{" in prefix or "}" in prefix):
            raise ConfigurationError(
                f"RedisLockStore: prefix {prefix!r} holds a brace; on Redis Cluster the store makes keys hash tags, "
                "and a brace in the prefix would put every key in one slot"
            )
        self._prefix = prefix
        self._registered: dict[str, Any] = {}
        self._policy = _Reconnect()

    @property
    def _client(self) -> Any:
        return self._topology.client

    def _script(self, name: str) -> Any:
        """Script ``name`` registered with the client (on first use: a cluster's client is made then)."""
        script = self._registered.get(name)
        if script is None:
            script = self._registered[name] = self._client.register_script(source(name))
        return script

    @property
    def _release(self) -> Any:
        return self._script("lock_release")

    @property
    def _renew(self) -> Any:
        return self._script("lock_renew")

    @property
    def _take_many(self) -> Any:
        return self._script("lock_take_many")

    @property
    def _count(self) -> Any:
        return self._script("lock_count")

    @property
    def _tally_add(self) -> Any:
        return self._script("tally_add")

    @property
    def _tally_settle(self) -> Any:
        return self._script("tally_settle")

    @property
    def _tally_unsettle(self) -> Any:
        return self._script("tally_unsettle")

    @property
    def _tally_settle_many(self) -> Any:
        return self._script("tally_settle_many")

    @classmethod
    def from_url(
        cls,
        url: str | None,
        prefix: str = "rainier:lock:",
        *,
        connect_timeout_ms: float | None = None,
        response_timeout_ms: float | None = None,
        reconnect: bool = False,
        reconnect_attempts: int | None = None,
        reconnect_max_backoff_ms: float | None = None,
        sentinels: Sequence[str] | str | None = None,
        service_name: str | None = None,
    ) -> RedisLockStore:
        """Connect to ``url`` (``redis://host:port/db``, ``redis+sentinel://…``,
        ``redis+cluster://…``); the timeouts, reconnect, ``sentinels`` and
        ``service_name`` settings mean what they do for :meth:`RedisQueue.from_url`."""
        target = _target("RedisLockStore", url, sentinels, service_name)
        connect_timeout, response_timeout, policy = _connection_settings(
            "redis lock store",
            connect_timeout_ms,
            response_timeout_ms,
            reconnect,
            reconnect_attempts,
            reconnect_max_backoff_ms,
        )
        store = cls(_Topology(target, connect_timeout, response_timeout, None), prefix=prefix)
        store._policy = policy
        return store

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _tagged(self, kind: str, key: str) -> str:
        """``P<kind>:<key>``, the name keys used together are made from; on a cluster
        ``P<kind>:{<key>}`` (a key that could not be a hash tag is tagged by its digest)."""
        if not self._topology.cluster:
            return f"{self._prefix}{kind}:{key}"
        if key and "{" not in key and "}" not in key:
            return f"{self._prefix}{kind}:{{{key}}}"
        return f"{self._prefix}{kind}:{{#{hashlib.sha1(key.encode()).hexdigest()[:16]}}}{key}"  # noqa: S324

    def _pipelined(self, script: Any, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """``script`` once per ``(keys, args)``, pipelined: one round trip per server
        (redis-py pipelines no script across a cluster's nodes, so each node gets its own)."""
        client = self._client
        if not self._topology.cluster:
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                script(keys=keys, args=args, client=pipe)
            return list(pipe.execute())
        nodes: dict[str, tuple[Any, list[int]]] = {}
        for i, (keys, _) in enumerate(calls):
            node = client.get_node_from_key(keys[0])
            nodes.setdefault(node.name, (node, []))[1].append(i)
        replies: list[Any] = [None] * len(calls)
        for node, indices in nodes.values():
            pipe = client.get_redis_connection(node).pipeline(transaction=False)
            for i in indices:
                script(keys=calls[i][0], args=calls[i][1], client=pipe)
            for i, reply in zip(indices, pipe.execute(), strict=True):
                replies[i] = reply
        return replies

    def _named(self) -> str:
        return f"redis lock store ({self._topology.describe()})"

    def _call(self, what: str, attempt: Callable[[], _T]) -> _T:
        return _retrying(self._policy, self._named, what, attempt, topology=self._topology)

    def acquire(self, key: str, owner: str, ttl: float) -> bool:
        name, px = self._key(key), _ttl_ms(ttl, key)
        tries = 0

        def attempt() -> bool:
            nonlocal tries
            tries += 1
            if tries == 1:
                return bool(self._client.set(name, owner, nx=True, px=px))
            # the broken try's SET may have run, with only its reply lost: the key's
            # old value holding our own owner token means the lock is ours
            return _ours(self._client.set(name, owner, nx=True, px=px, get=True), owner)

        return self._call(f"acquire of {key!r}", attempt)

    def release(self, key: str, owner: str) -> bool:
        return self._call(f"release of {key!r}", lambda: bool(self._release(keys=[self._key(key)], args=[owner])))

    def renew(self, key: str, owner: str, ttl: float) -> bool:
        name, px = self._key(key), _ttl_ms(ttl, key)
        return self._call(f"renewal of {key!r}", lambda: bool(self._renew(keys=[name], args=[owner, px])))

    def acquire_many(self, items: Sequence[tuple[str, str]], ttl: float) -> list[bool]:
        """Every ``SET NX PX`` in one pipelined round trip (not a transaction: each is atomic on its own)."""
        if not items:
            return []
        wanted = [(self._key(key), owner, _ttl_ms(ttl, key)) for key, owner in items]
        tries = 0

        def attempt() -> list[bool]:
            nonlocal tries
            tries += 1
            again = tries > 1
            pipe = self._client.pipeline(transaction=False)
            for name, owner, px in wanted:
                pipe.set(name, owner, nx=True, px=px, get=again)  # as acquire() does after a broken try
            replies = pipe.execute()
            if not again:
                return [bool(done) for done in replies]
            return [_ours(old, owner) for old, (_, owner, _) in zip(replies, wanted, strict=True)]

        return self._call(f"acquire of {len(items)} lock(s), {items[0][0]!r} first", attempt)

    def renew_many(self, items: Sequence[tuple[str, str]], ttl: float) -> list[bool]:
        """Every owner-checked renewal in one pipelined round trip."""
        if not items:
            return []
        wanted = [(self._key(key), owner, _ttl_ms(ttl, key)) for key, owner in items]

        def attempt() -> list[bool]:
            calls = [([name], [owner, px]) for name, owner, px in wanted]
            return [bool(done) for done in self._pipelined(self._renew, calls)]

        return self._call(f"renewal of {len(items)} lock(s), {items[0][0]!r} first", attempt)

    def owner(self, key: str) -> str | None:
        value: Any = self._call(f"owner of {key!r}", lambda: self._client.get(self._key(key)))
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    # -- coordination: a sliding window and counters keep the library's clock in
    # their values (freezegun moves them); Redis's own expiry only clears keys
    # left idle well past their window.
    def take(self, key: str, limit: int, per: float) -> float:
        taken, rooms = self.take_many(key, 1, limit, per)
        return 0.0 if taken else rooms[0]

    def take_many(self, key: str, n: int, limit: int, per: float, hold: float = 0.0) -> tuple[int, list[float]]:
        """One script: the window is a sorted set of batches of starts (``<id>:<count>``)."""
        name, keep, member = self._key("window:" + key), _keep_ms(per + hold), uuid.uuid4().hex

        def attempt() -> tuple[int, list[float]]:
            now = _clock.now()
            reply = self._take_many(keys=[name], args=[now, per, limit, n, now + hold, member, keep, ROOMS])
            return int(reply[0]), [float(room) for room in reply[1:]]

        return self._call(f"window {key!r}", attempt)

    def count(self, key: str, window: float) -> int:
        name, keep = self._key("count:" + key), _keep_ms(window)
        return self._call(f"count {key!r}", lambda: int(self._count(keys=[name], args=[_clock.now(), window, keep])))

    def counted(self, key: str) -> tuple[int, float]:
        held: Any = self._call(f"count {key!r}", lambda: self._client.hmget(self._key("count:" + key), "n", "until"))
        if held[0] is None or float(held[1]) <= _clock.now():
            return (0, 0.0)
        return (int(held[0]), float(held[1]))

    def reset(self, key: str) -> None:
        self._call(f"reset of {key!r}", lambda: self._client.delete(self._key("count:" + key)))

    def set_flag(self, group: str, member: str, on: bool) -> None:
        name = self._key("flags:" + group)
        if on:
            self._call(f"flag {member!r} of {group!r}", lambda: self._client.sadd(name, member))
        else:
            self._call(f"flag {member!r} of {group!r}", lambda: self._client.srem(name, member))

    def flags(self, group: str) -> set[str]:
        members: Any = self._call(f"flags of {group!r}", lambda: self._client.smembers(self._key("flags:" + group)))
        return {m.decode() if isinstance(m, bytes) else str(m) for m in members}

    # -- values: a hash under ``Pvalue:<key>`` (the value and when it lapses, by the
    # library's clock); ``Pvalue:<key>:ready`` a list a waiter blocks on, pushed
    # to when the value is put.
    def put_value(self, key: str, value: str, ttl: float) -> None:
        name, px = self._tagged("value", key), _ttl_ms(ttl, key)

        def attempt() -> None:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(name)
            pipe.hset(name, mapping={"v": value, "until": repr(_clock.now() + float(ttl))})
            pipe.pexpire(name, px + int(_IDLE_KEEP * 1000))
            pipe.delete(name + ":ready")
            pipe.rpush(name + ":ready", "1")
            pipe.pexpire(name + ":ready", 60_000)
            pipe.execute()

        self._call(f"value {key!r}", attempt)

    def get_value(self, key: str) -> str | None:
        got: Any = self._call(f"value {key!r}", lambda: self._client.hmget(self._tagged("value", key), "v", "until"))
        if got[0] is None or float(got[1]) <= _clock.now():
            return None
        return got[0].decode() if isinstance(got[0], bytes) else str(got[0])

    def wait_value(self, key: str, timeout: float, done: Callable[[str | None], bool]) -> str | None:
        """Blocks on the value's ready list (``BLPOP``) between reads: woken when it is put."""
        ready = self._tagged("value", key) + ":ready"
        deadline = _clock.monotonic() + max(0.0, timeout)
        while True:
            value = self.get_value(key)
            left = deadline - _clock.monotonic()
            if done(value) or left <= 0:
                return value
            # Short blocks, each well inside the connection's response timeout, which may be
            # shorter than the wait: a block longer than it would read as a frozen server.
            reply = self._topology.response_timeout
            block = min(left, 1.0, reply / 4 if reply else 1.0)
            popped = self._call(f"wait for {key!r}", lambda: self._client.blpop([ready], timeout=block))  # noqa: B023
            if popped:
                self._call(f"wait for {key!r}", lambda: self._client.rpush(ready, "1"))  # for other waiters

    # -- tallies: ``Ptally:<key>`` a hash of counts, ``Ptally:<key>:members`` the members settled
    def _tally_keys(self, key: str) -> list[str]:
        name = self._tagged("tally", key)
        return [name, name + ":members"]

    def tally_add(self, key: str, counts: dict[str, int], ttl: float) -> dict[str, int]:
        keys = self._tally_keys(key)
        args: list[Any] = [_ttl_ms(ttl, key)]
        for field, n in counts.items():
            args += [field, int(n)]
        return _counts(self._call(f"tally {key!r}", lambda: self._tally_add(keys=keys, args=args)))

    def tally_settle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        keys = self._tally_keys(key)
        reply: Any = self._call(
            f"tally {key!r}", lambda: self._tally_settle(keys=keys, args=[member, field, _ttl_ms(ttl, key)])
        )
        return _counts(reply[1:]), bool(reply[0])

    def tally_settle_many(self, items: Sequence[tuple[str, str, str, float]]) -> list[tuple[dict[str, int], bool]]:
        """One script per tally (one round trip for the items of one batch, up to a thousand)."""
        by_key: dict[str, list[int]] = {}
        for index, (key, _, _, _) in enumerate(items):
            by_key.setdefault(key, []).append(index)
        if any(len(indexes) > 1000 for indexes in by_key.values()):  # a script's arguments stay few
            head = self.tally_settle_many(items[:1000])
            return last_counts(items, head + self.tally_settle_many(items[1000:]))
        out: list[tuple[dict[str, int], bool]] = [({}, False)] * len(items)
        for key, indexes in by_key.items():
            args: list[Any] = [_ttl_ms(max(items[i][3] for i in indexes), key)]
            for i in indexes:
                args += [items[i][1], items[i][2]]
            keys = self._tally_keys(key)
            reply: Any = self._call(
                f"tally {key!r}", lambda: self._tally_settle_many(keys=keys, args=args)  # noqa: B023
            )
            n = int(reply[0])
            counts = _counts(reply[1 + n :])
            for i, new in zip(indexes, reply[1 : 1 + n], strict=True):
                out[i] = (dict(counts), bool(new))
        return out

    def tally_unsettle(self, key: str, member: str, field: str, ttl: float) -> tuple[dict[str, int], bool]:
        keys = self._tally_keys(key)
        reply: Any = self._call(
            f"tally {key!r}", lambda: self._tally_unsettle(keys=keys, args=[member, field, _ttl_ms(ttl, key)])
        )
        return _counts(reply[1:]), bool(reply[0])

    def tally(self, key: str) -> dict[str, int] | None:
        got: Any = self._call(f"tally {key!r}", lambda: self._client.hgetall(self._tally_keys(key)[0]))
        return {_text(k): int(v) for k, v in got.items()} if got else None

    def close(self) -> None:
        self._topology.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _counts(flat: Any) -> dict[str, int]:
    """A flat ``HGETALL`` reply as counts."""
    return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
