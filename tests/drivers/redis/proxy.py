"""A TCP proxy in front of the real Redis, owned by one test: it forwards, breaks
(cuts every connection and resets new ones: the server is down), freezes (holds
every byte both ways: the server hangs) or goes deaf (holds the replies), so outages are simulated without
touching the shared server."""

from __future__ import annotations

import select
import socket
import struct
import threading
from urllib.parse import urlsplit


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a dying server's kernel would."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Proxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._db = parts.path.lstrip("/") or "0"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._mode = "forward"
        self._changed = threading.Condition()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.accepted = 0
        self._acceptor = threading.Thread(target=self._accept, name="redis-test-proxy", daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{self._db}"

    def break_(self) -> None:
        """Cut every connection and reset every new one until :meth:`heal`."""
        with self._changed:
            self._mode = "broken"
            pairs, self._pairs = self._pairs, []
            self._changed.notify_all()
        for client, server in pairs:
            _reset(client)
            server.close()

    def refuse_new(self, keep: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """Reset new connections, and every open one but those from the client ports in
        ``keep``, until :meth:`heal`: the server went away while one idle socket lingers."""
        with self._changed:
            self._mode = "broken"
            cut = [pair for pair in self._pairs if pair[0].getpeername()[1] not in keep]
            self._pairs = [pair for pair in self._pairs if pair not in cut]
            self._changed.notify_all()
        for client, server in cut:
            _reset(client)
            server.close()

    def freeze(self) -> None:
        """Accept connections and hold every byte, both ways, until :meth:`heal`."""
        with self._changed:
            self._mode = "frozen"
            self._changed.notify_all()

    def deafen(self) -> None:
        """Forward what clients send, and hold the server's replies, until :meth:`heal`
        or :meth:`break_`: a command runs, and its reply is lost."""
        with self._changed:
            self._mode = "deaf"
            self._changed.notify_all()

    def heal(self) -> None:
        with self._changed:
            self._mode = "forward"
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            pairs, self._pairs = self._pairs, []
            self._changed.notify_all()
        for client, server in pairs:
            client.close()
            server.close()
        self._acceptor.join(5)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self._mode == "broken":
                _reset(client)
                continue
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._changed:
                if self._closed or self._mode == "broken":
                    _reset(client)
                    server.close()
                    continue
                self._pairs.append((client, server))
            thread = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        try:
            while not self._closed:
                with self._changed:
                    while self._mode == "frozen" and not self._closed:
                        self._changed.wait(0.1)
                deaf = self._mode == "deaf"
                readable, _, _ = select.select([client] if deaf else [client, server], [], [], 0.05)
                if self._mode == "frozen" or (server in readable and self._mode == "deaf"):
                    continue  # froze (or went deaf) while waiting: what arrived stays unread
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peer[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._changed:
                if (client, server) in self._pairs:
                    self._pairs.remove((client, server))
            client.close()
            server.close()
