"""Backends that come up after the worker: a real ``redis-server`` started on a
chosen loopback port, and a TCP forwarder that begins forwarding a chosen port
to a real server (PostgreSQL) only when told to. Also a ``queue:work``
subprocess whose stderr is read line by line, so a test can wait for the
worker's first failed attempt before bringing the backend up."""

from __future__ import annotations

import os
import pathlib
import select
import socket
import subprocess
import sys
import threading
from typing import Callable

from tests.services.redis_topologies import Server, _binaries, _data_node

from .conftest import ROOT


def redis_server(directory: pathlib.Path, port: int) -> Server:
    """A ``redis-server`` on ``127.0.0.1:port``, its dump file in ``directory``, up."""
    server = _data_node(_binaries()[0], directory, port)
    server.wait_up()
    return server


class Forwarder:
    """Listens on ``127.0.0.1:port`` and forwards every connection to ``upstream``."""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(0.05)
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            thread = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        try:
            while not self._closed:
                readable, _, _ = select.select([client, server], [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peer[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            client.close()
            server.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for sock in self._sockets:
                sock.close()
        for thread in self._threads:
            thread.join(5)
        self._listener.close()


class WorkerProcess:
    """``python -m rainier_sync queue:work *args`` with its stderr read as it comes."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        full_env = {k: v for k, v in os.environ.items() if k not in ("QUEUE_DRIVER", "RAINIER_APP", "DATABASE_URL")}
        full_env.update(env)
        self.lines: list[str] = []
        self._done = False
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rainier_sync", "queue:work", *args],
            cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._done = True
                self._changed.notify_all()

    def wait_for_line(self, matches: Callable[[str], bool], timeout: float = 60) -> str:
        """The first stderr line ``matches`` accepts; fails when the process ends or ``timeout`` passes first."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(matches(line) for line in self.lines) or self._done, timeout
            )
            hit = next((line for line in self.lines if matches(line)), None)
        assert found and hit is not None, f"no such line; the worker wrote:\n{self.stderr}"
        return hit

    def wait(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        return code

    @property
    def stderr(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
