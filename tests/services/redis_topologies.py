"""Redis Cluster and Redis Sentinel for the Redis driver's tests: ``redis-server``
processes of the test run's own, on free loopback ports.

- ``redis_cluster_url`` (session): three masters (``--cluster-enabled yes``),
  joined by ``redis-cli --cluster create … --cluster-replicas 0``; yields
  ``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``.
- ``redis_sentinel_url`` (session): a master, a replica and three sentinels
  (``redis-server --sentinel``) watching it as ``rainier``; yields
  ``redis+sentinel://127.0.0.1:s1,…/rainier/0``. No test fails it over.
- ``sentinel_group`` (function): the same, of the test's own, to fail over
  (:meth:`SentinelGroup.failover`).

Every server keeps nothing on disk (``--save ''``), dies with pytest
(``PR_SET_PDEATHSIG``), and is stopped at the end. ``redis-server`` and
``redis-cli`` come from the ``redis-server`` package (``.ci/services.sh``).
"""

from __future__ import annotations

import ctypes
import pathlib
import shutil
import signal
import socket
import subprocess
import time
from typing import Iterator

import pytest

from tests.support import free_port, missing_service, port_open

SERVICE = "rainier"
_HOW = "apt-get install redis-server (it ships redis-server, redis-cli and the sentinel mode)"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        missing_service("redis-server and redis-cli (to start a Redis Cluster and sentinels)", _HOW)
        raise AssertionError("unreachable")
    return server, cli


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 < 65536 and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class Server:
    """One ``redis-server`` process (a data node or a sentinel)."""

    def __init__(self, args: list[str], port: int, log: pathlib.Path) -> None:
        self.port = port
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def wait_up(self, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited; log {self.log}:\n{self.tail()}")
            if port_open("127.0.0.1", self.port, timeout=0.2):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not come up; log {self.log}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _data_node(server: str, directory: pathlib.Path, port: int, *extra: str) -> Server:
    directory.mkdir(parents=True, exist_ok=True)
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--dbfilename", f"dump-{port}.rdb", "--repl-diskless-sync-delay", "0", *extra]
    return Server(args, port, directory / f"redis-{port}.log")


def _started(make, pick=free_port) -> Server:  # type: ignore[no-untyped-def]
    """``make(port)`` on a free port, up; another port if this one was taken meanwhile."""
    for attempt in range(3):
        server = make(pick())
        try:
            server.wait_up()
            return server
        except RuntimeError:
            server.stop()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _client(port: int):  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=2)


def _until(predicate, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - not ready yet
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {seconds}s waiting for {what}")


class Cluster:
    """Three cluster masters on loopback."""

    def __init__(self, directory: pathlib.Path, masters: int = 3) -> None:
        server, cli = _binaries()
        self.nodes: list[Server] = []
        try:
            for _ in range(masters):
                self.nodes.append(_started(lambda port: _data_node(
                    server, directory, port, "--cluster-enabled", "yes",
                    "--cluster-config-file", str(directory / f"nodes-{port}.conf"), "--cluster-node-timeout", "2000",
                ), _cluster_port))
            made = subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=60,
            )
            if made.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{made.stdout}\n{made.stderr}")
            for node in self.nodes:
                _until(lambda n=node: b"cluster_state:ok" in _client(n.port).execute_command("CLUSTER", "INFO"),
                       30, f"cluster node {node.port} to see the cluster ok")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelGroup:
    """A master, its replica and three sentinels watching it as :data:`SERVICE`."""

    def __init__(self, directory: pathlib.Path) -> None:
        server, _ = _binaries()
        self.directory = directory
        self.data: list[Server] = []
        self.sentinels: list[Server] = []
        try:
            self.data.append(_started(lambda port: _data_node(server, directory, port)))
            master = self.data[0].port
            self.data.append(_started(
                lambda port: _data_node(server, directory, port, "--replicaof", "127.0.0.1", str(master))
            ))
            replica = self.data[1].port
            _until(lambda: _client(replica).info("replication")["master_link_status"] == "up",
                   20, "the replica to sync")
            for _ in range(3):
                self.sentinels.append(_started(lambda port: self._sentinel(server, port, master)))
            self.wait_settled(master)
        except BaseException:
            self.stop()
            raise

    def _sentinel(self, server: str, port: int, master: int) -> Server:
        conf = self.directory / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 2000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        return Server([server, str(conf), "--sentinel"], port, self.directory / f"sentinel-{port}.log")

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{SERVICE}/0"

    @property
    def sentinel_hosts(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    def master_port(self) -> int:
        """The master's port as the first sentinel names it."""
        _, port = _client(self.sentinels[0].port).sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def replica_port(self) -> int:
        master = self.master_port()
        return next(server.port for server in self.data if server.port != master)

    def wait_settled(self, master: int, seconds: float = 30.0) -> None:
        """Until every sentinel names ``master``, knows the replica and the other two sentinels."""

        def settled(port: int) -> bool:
            fields = _client(port).sentinel_master(SERVICE)
            return (
                int(fields["port"]) == master
                and int(fields["num-other-sentinels"]) == 2
                and int(fields["num-slaves"]) >= 1
                and not fields["is_sdown"]
            )

        for sentinel in self.sentinels:
            _until(lambda s=sentinel: settled(s.port), seconds, f"sentinel {sentinel.port} to settle")

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: the replica is promoted (the old master is moved aside later)."""
        reply = _client(self.sentinels[0].port).execute_command("SENTINEL", "FAILOVER", SERVICE)
        assert reply in (b"OK", "OK", True), reply

    def stop(self) -> None:
        for server in [*self.sentinels, *self.data]:
            server.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group = SentinelGroup(tmp_path_factory.mktemp("redis-sentinel"))
    try:
        yield group.url
    finally:
        group.stop()


@pytest.fixture
def sentinel_group(tmp_path: pathlib.Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path)
    try:
        yield group
    finally:
        group.stop()
