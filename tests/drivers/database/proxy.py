"""A TCP proxy a test owns, put between the driver and a real server, to break
the network without touching the server other tests share.

- ``cut()``: every connection through it is reset, and new ones are reset as
  they arrive (a server that went away).
- ``freeze()``: connections stay open and new ones are accepted, but no byte
  passes either way (what a stopped server process, or a silent network,
  looks like to a client).
- ``heal()``: bytes flow again; what a freeze held back is delivered.
"""

from __future__ import annotations

import socket
import struct
import threading
import urllib.parse
from typing import Iterator


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._cut = False
        self._closed = False
        #: Connections accepted since the proxy started (each client's connect).
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    # -- controls ---------------------------------------------------------------------------
    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sockets = list(self._sockets)
            self._sockets.clear()
        self._flowing.set()  # pumps held by a freeze wake, find their sockets gone and end
        for sock in sockets:
            _reset(sock)

    def freeze(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        with self._lock:
            self._cut = False
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._thread.join(5)
        self._listener.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding -------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                refused = self._cut or self._closed
                if not refused:
                    self._sockets.add(client)
            if refused:
                _reset(client)
                continue
            threading.Thread(target=self._serve, args=(client,), name="tcp-proxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._flowing.wait()  # frozen: accepted, and never answered until healed
        with self._lock:
            if client not in self._sockets:
                return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            if client not in self._sockets:
                _reset(upstream)
                return
            self._sockets.add(upstream)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), name="tcp-proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        for data in _chunks(src):
            self._flowing.wait()
            with self._lock:
                alive = src in self._sockets and dst in self._sockets
            if not alive:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        with self._lock:
            self._sockets.discard(src)
            self._sockets.discard(dst)
        _reset(src)
        _reset(dst)


def _chunks(sock: socket.socket) -> Iterator[bytes]:
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        yield data


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): the peer hears of it at once."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def through(url: str, proxy: TcpProxy) -> str:
    """``url`` pointed at the proxy instead of the server (same user, database and options)."""
    parts = urllib.parse.urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))


def proxy_for(url: str) -> TcpProxy:
    """A proxy in front of the server ``url`` points at."""
    parts = urllib.parse.urlsplit(url)
    return TcpProxy(parts.hostname or "127.0.0.1", parts.port or (5432 if url.startswith("postgres") else 3306))
