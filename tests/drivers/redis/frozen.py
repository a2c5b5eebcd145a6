"""Redis servers that never answer, for tests of the driver's default bounds.

- :func:`frozen_redis`: a ``redis-server`` of the test's own on a free loopback
  port, stopped with SIGSTOP once it answers: it still accepts connections
  (the kernel completes them), and answers nothing — a stopped VM, a
  half-open connection through a NAT.
- :func:`silent_host`: a loopback listener whose accept queue is full, so a
  connection to it is never completed: a host that drops the handshake.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.services.redis_topologies import _binaries, _data_node, _started
from tests.support import freeze_process, wait_until


@contextmanager
def frozen_redis(directory: Path) -> Iterator[str]:
    """The URL (database 0) of a real Redis that accepts connections and never replies."""
    binary, _ = _binaries()
    server = _started(lambda port: _data_node(binary, directory, port))
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5, socket_connect_timeout=5)
        try:
            wait_until(lambda: bool(client.ping()), 10, 0.05, f"redis-server on port {server.port} to answer")
        finally:
            client.close()
        freeze_process(server.proc.pid)
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)  # a stopped process takes SIGTERM only once it runs
        server.stop()


@contextmanager
def silent_host() -> Iterator[str]:
    """The URL of a loopback port where a new connection is never completed.

    The listener never accepts, and its queue (a backlog of 0 holds one) is
    filled by a connection of its own: Linux then drops every further
    handshake, as a host that is gone or filtered does."""
    listener = socket.socket()
    filler = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.settimeout(5)
        filler.connect(("127.0.0.1", port))
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        filler.close()
        listener.close()
