"""The watchdog: no PostgreSQL statement waits on a silent server for ever."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import Any

from ... import _clock


class _Watchdog:
    """Shuts down the socket of a PostgreSQL connection that has waited on its
    server longer than its ``response_timeout``.

    psycopg has no client-side timeout on a statement, and TCP keepalives do not
    help against a server process that is stopped but still connected (its
    kernel keeps acknowledging). Shutting the socket down makes the blocked
    read end at once, as if the server had closed the connection.
    """

    #: How often the watchdog looks: a timeout fires at most this much late.
    TICK = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, tuple[float, Any]] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, conn: Any, timeout: float) -> int:
        key = next(self._keys)
        deadline = _clock.monotonic() + timeout
        with self._lock:
            self._waits[key] = (deadline, conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rainier-db-watchdog", daemon=True)
                self._thread.start()
        return key

    def done(self, key: int) -> None:
        with self._lock:
            self._waits.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK)
            now = _clock.monotonic()
            with self._lock:
                # Under the lock: a wait still listed has not returned, so its
                # socket is still that connection's.
                for key, (deadline, conn) in list(self._waits.items()):
                    if now >= deadline:
                        del self._waits[key]
                        conn.timed_out = True
                        try:
                            _shut_down(conn.pgconn.socket)
                        except Exception:  # noqa: BLE001 - closed meanwhile: nothing left to end
                            pass

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._waits = {}
        self._thread = None


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


def _shut_down(fd: int) -> None:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()  # the duplicate only: the connection still owns its descriptor


_CLASSES: dict[str, Any] = {}


def watched_connection_class(psycopg: Any) -> Any:
    """A psycopg ``Connection`` whose every wait on its server is watched."""
    cls = _CLASSES.get("postgresql")
    if cls is None:

        class WatchedConnection(psycopg.Connection):  # type: ignore[misc]
            response_timeout: float | None = None
            timed_out = False

            def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
                timeout = self.response_timeout
                if timeout is None:
                    return super().wait(gen, *args, **kwargs)
                key = _WATCHDOG.watch(self, timeout)
                try:
                    return super().wait(gen, *args, **kwargs)
                finally:
                    _WATCHDOG.done(key)

        _CLASSES["postgresql"] = cls = WatchedConnection
    return cls
