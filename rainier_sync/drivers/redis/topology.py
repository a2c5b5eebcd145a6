"""Where the Redis driver's and the lock store's commands go: one server, the
master a group of Sentinels watches, or a Redis Cluster.

- ``redis://``, ``rediss://``, ``unix://``: one server, as always.
- ``redis+sentinel://h1:26379,h2:26379/SERVICE/DB``: the master of ``SERVICE``,
  found by asking the sentinels (redis-py's ``SentinelConnectionPool``), and
  found again after a failover: the first command after one re-resolves it.
  Sentinel only moves the old master aside some ten seconds after a forced
  failover, so a subscription to the sentinels' ``+switch-master`` (read by
  whoever uses the driver next, with no thread of its own) moves every
  connection as soon as the sentinels announce the new master.
- ``redis+cluster://h1:7000,h2:7001``: redis-py's ``RedisCluster``; the driver's
  own connections are taken from the pool of the node serving a key's slot.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from ...errors import DriverUnavailableError
from .targets import _Target

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException
    from redis.retry import Retry
    from redis.sentinel import Sentinel, SentinelConnectionPool
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError("the Redis driver needs redis-py: pip install 'rainier_sync[redis]'") from error

log = logging.getLogger("rainier_sync")

# redis-py leaves these untyped
_SentinelClass: Any = Sentinel
_ClusterClass: Any = RedisCluster
_NodeClass: Any = ClusterNode

__all__ = ["_Topology"]

# -- building clients ------------------------------------------------------------------------


def _common(connect_timeout: float | None, response_timeout: float | None, name: str | None) -> dict[str, Any]:
    return {
        "protocol": 2,
        "decode_responses": False,
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": response_timeout,
        "client_name": name,
    }


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


class _Topology:
    """The client, and where a key's commands go on it.

    ``pool(key)`` is the connection pool of the server holding ``key`` (on one
    server or under Sentinel, the client's own pool); ``generation`` grows
    when the sentinels announce a new master, and connections held from before
    are dropped by their owners."""

    def __init__(
        self,
        target: _Target,
        connect_timeout: float | None = None,
        response_timeout: float | None = None,
        name: str | None = None,
        client: Any = None,
    ) -> None:
        self.target = target
        self.cluster = target.kind == "cluster"
        self.generation = 0
        self._settings = (connect_timeout, response_timeout, name)
        self._client = client
        self._lock = threading.Lock()
        self._slots: dict[str, int] = {}
        self._watch: _SentinelWatch | None = None
        if client is None and target.kind != "cluster":
            self._client = self._build()
        if target.kind == "sentinel":
            self._watch = _SentinelWatch(self)


    @property
    def response_timeout(self) -> float | None:
        """Seconds a reply may take on this client: declared, or read from a wrapped
        client's pool (None: unbounded, or not known)."""
        declared = self._settings[1]
        if declared is not None:
            return declared
        pool = getattr(self._client, "connection_pool", None)
        found = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
        return float(found) if isinstance(found, (int, float)) and found > 0 else None

    @classmethod
    def of(cls, client: Any) -> _Topology:
        """The topology of a client built elsewhere: a ``redis.Redis`` (on a
        ``SentinelConnectionPool`` too) or a ``RedisCluster``."""
        if isinstance(client, RedisCluster):
            return cls(_Target("cluster"), client=client)
        pool = getattr(client, "connection_pool", None)
        if isinstance(pool, SentinelConnectionPool):
            found = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
            hosts = tuple((str(kw.get("host", "?")), int(kw.get("port", 0))) for kw in found)
            db = int(pool.connection_kwargs.get("db", 0) or 0)
            return cls(_Target("sentinel", hosts=hosts, service=pool.service_name, db=db), client=client)
        return cls(_Target("server"), client=client)

    def _build(self) -> Any:
        connect_timeout, response_timeout, name = self._settings
        common = _common(connect_timeout, response_timeout, name)
        target = self.target
        if target.kind == "server":
            assert target.url is not None
            pool = redis.ConnectionPool.from_url(target.url, retry=_no_retry(), **common)
            client = redis.Redis(connection_pool=pool)
            client.auto_close_connection_pool = True
            return client
        credentials: dict[str, Any] = {"username": target.username, "password": target.password}
        if target.kind == "sentinel":
            sentinel: Any = _SentinelClass(
                list(target.hosts),
                sentinel_kwargs={
                    "socket_connect_timeout": connect_timeout,
                    "socket_timeout": response_timeout,
                    "retry": _no_retry(),  # a sentinel that does not answer: the next one is asked
                },
            )
            return sentinel.master_for(target.service, db=target.db, retry=_no_retry(), **credentials, **common)
        try:
            return _ClusterClass(
                startup_nodes=[_NodeClass(host, port) for host, port in target.hosts],
                retry=_no_retry(),
                **credentials,
                **common,
            )
        except RedisClusterException as exc:
            # unreachable at first use: reported, and tried again, as an outage is
            raise redis.ConnectionError(f"Redis Cluster not reachable: {exc}") from exc

    @property
    def client(self) -> Any:
        """The redis-py client (a cluster's is made on first use: making it reads the slot map)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._build()
                client = self._client
        return client

    # -- routing ---------------------------------------------------------------------------
    def route(self, key: str) -> tuple[str, Any]:
        """The name and connection pool of the server holding ``key``."""
        client = self.client
        if not self.cluster:
            return "", client.connection_pool
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = client.keyslot(key)
            if len(self._slots) > 10_000:
                self._slots.clear()
        nodes = client.nodes_manager.slots_cache.get(slot)
        if not nodes:
            raise redis.ConnectionError(f"Redis Cluster: slot {slot} (key {key!r}) is served by no node now")
        node = nodes[0]
        return node.name, client.get_redis_connection(node).connection_pool

    def pools(self) -> list[Any]:
        """Every pool commands may have gone to."""
        client = self._client
        if client is None:
            return []
        if not self.cluster:
            return [client.connection_pool]
        return [node.redis_connection.connection_pool for node in client.get_nodes() if node.redis_connection]

    def refresh(self) -> None:
        """Read the cluster's slot map again (after a MOVED, a failed node)."""
        if self.cluster and self._client is not None:
            try:
                self._client.nodes_manager.initialize()
            except (RedisClusterException, redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.debug("redis cluster: could not read the slot map again: %s", exc)

    def readonly(self) -> None:
        """A server answered READONLY (demoted under us): drop idle connections, so the next resolve afresh."""
        for pool in self.pools():
            pool.disconnect(inuse_connections=False)

    # -- Sentinel ---------------------------------------------------------------------------
    def check(self) -> None:
        """Before a command: notice a failover the sentinels announced (a non-blocking read)."""
        if self._watch is not None:
            self._watch.poll()

    def watch_socket(self) -> Any:
        """The sentinel subscription's socket, for an idle wait to watch too (None if none)."""
        return self._watch.socket() if self._watch is not None else None

    def switched(self, address: tuple[str, int] | None) -> None:
        """The sentinels announced a new master: resolve it, and have held connections dropped."""
        pool = self.client.connection_pool
        try:
            pool.get_master_address()  # resolves it, and drops the pool's idle connections
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.debug("redis sentinel: could not resolve the new master yet: %s", exc)
            pool.disconnect(inuse_connections=False)
        self.generation += 1
        log.warning(
            "redis sentinel: service %r has a new master%s; reconnecting",
            self.target.service,
            f" ({address[0]}:{address[1]})" if address else "",
        )

    def place(self) -> tuple[Any, ...] | None:
        """Which server and database this topology's keys live on, to tell whether
        two clients share them: one server by its address, a Sentinel service by
        its name, its sentinels and database; None on a cluster (keys on many nodes)."""
        target = self.target
        if target.kind == "cluster":
            return None
        if target.kind == "sentinel":
            return ("sentinel", target.service, frozenset(target.hosts), target.db)
        kwargs = self.client.connection_pool.connection_kwargs
        where = kwargs.get("path") or (kwargs.get("host"), kwargs.get("port"))
        return ("server", where, self.database())

    def timeouts(self) -> tuple[float | None, float | None]:
        """The connections' connect and response timeouts, in seconds (None: unbounded,
        which only a client built elsewhere can be)."""
        connect_timeout, response_timeout, _ = self._settings
        if connect_timeout is None and response_timeout is None and not self.cluster:
            kwargs = self.client.connection_pool.connection_kwargs
            return kwargs.get("socket_connect_timeout"), kwargs.get("socket_timeout")
        return connect_timeout, response_timeout

    def database(self) -> int | None:
        """The database index the connections select (None on a cluster, which has only 0)."""
        if self.target.kind == "cluster":
            return None
        if self.target.kind == "sentinel":
            return self.target.db
        return int(self.client.connection_pool.connection_kwargs.get("db", 0) or 0)

    def describe(self) -> str:
        target = self.target
        if target.kind == "sentinel":
            hosts = ",".join(f"{h}:{p}" for h, p in target.hosts)
            return f"sentinel {target.service}@{hosts}/{target.db}"
        if target.kind == "cluster":
            if target.hosts:
                return "cluster " + ",".join(f"{h}:{p}" for h, p in target.hosts)
            return "cluster"
        kwargs = self.client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        return f"{where}/{kwargs.get('db', 0)}"

    def forked(self) -> None:
        if self._watch is not None:
            self._watch.forked()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        client = self._client
        if client is not None:
            client.close()


class _SentinelWatch:
    """A subscription to one sentinel's ``+switch-master`` channel, read without
    blocking by whichever thread uses the driver next. When it cannot be opened
    (or breaks), it is tried again on the next sentinel after a pause; once
    (re)opened it compares the master the sentinels name with the one connected
    to, so a failover announced while it was down is still noticed."""

    def __init__(self, topology: _Topology) -> None:
        self._topology = topology
        # in the order given (redis-py moves the one that answered to the front of its own list)
        self._sentinels = list(topology.client.connection_pool.sentinel_manager.sentinels)
        self._pubsub: Any = None
        self._lock = threading.Lock()
        self._next = 0
        self._retry_at = 0.0
        self._failures = 0
        self._pid = os.getpid()

    def forked(self) -> None:
        self._pubsub = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def socket(self) -> Any:
        pubsub = self._pubsub
        conn = pubsub.connection if pubsub is not None else None
        return conn._sock if conn is not None else None

    def poll(self) -> None:
        if self._pid != os.getpid():
            self.forked()
        if not self._lock.acquire(blocking=False):
            return  # another thread is reading it
        try:
            if self._pubsub is None:
                if time.monotonic() >= self._retry_at:
                    self._open()
                return
            self._read()
        finally:
            self._lock.release()

    def _read(self) -> None:
        pubsub = self._pubsub
        service = self._topology.target.service
        try:
            while True:
                message = pubsub.get_message(timeout=0.0)
                if message is None:
                    return
                if message.get("type") != "message":
                    continue
                # "<service> <old ip> <old port> <new ip> <new port>"
                words = message["data"].decode(errors="replace").split()
                if len(words) == 5 and words[0] == service:
                    self._topology.switched((words[3], int(words[4])))
        except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError) as exc:
            self._lost(exc)

    def _open(self) -> None:
        client = self._topology.client
        sentinel = self._sentinels[self._next % len(self._sentinels)]
        pubsub = sentinel.pubsub()
        try:
            pubsub.subscribe("+switch-master")
            before = client.connection_pool.master_address
            now = client.connection_pool.sentinel_manager.discover_master(self._topology.target.service)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._pubsub = pubsub
            self._lost(exc)
            return
        self._pubsub, self._failures = pubsub, 0
        if before is not None and tuple(now) != tuple(before):
            self._topology.switched(tuple(now))

    def _lost(self, exc: BaseException) -> None:
        pubsub, self._pubsub = self._pubsub, None
        self._failures += 1
        self._next += 1
        self._retry_at = time.monotonic() + min(0.1 * 2**self._failures, 5.0)
        log.debug("redis sentinel watch: %s; trying the next sentinel shortly", exc)
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def close(self) -> None:
        with self._lock:
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
