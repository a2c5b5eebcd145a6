"""The wake-up flag a worker's owning loop sleeps on, and that a backend, a
finishing job or ``Worker.stop()`` sets."""

from __future__ import annotations

import os
import select
import threading
import weakref

__all__ = ["Waker"]


def _close_pipe(read: int, write: int) -> None:
    os.close(read)
    os.close(write)


class Waker:
    """A wake-up flag a worker's owning loop sleeps on.

    Backed by a pipe, so a driver can also ``select()`` on :meth:`fileno`
    together with its own socket (PostgreSQL ``LISTEN``, for instance).
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._flag = False
        # Re-entrant: stop() sets the waker from a signal handler, which may run in
        # the waiting thread while it holds the lock in clear(). Either order of the
        # two leaves the flag raised, never a byte in the pipe with the flag down.
        self._lock = threading.RLock()
        self._closed = False
        # The pipe is closed when the last holder (worker, pool thread, driver) lets go.
        self._finalizer = weakref.finalize(self, _close_pipe, self._read, self._write)
        # Not at interpreter exit: a daemon pool thread may still wake the loop then,
        # and the process closes its descriptors anyway.
        self._finalizer.atexit = False

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        if self._flag:  # already awake: the common case under load, no lock needed
            return
        with self._lock:
            if self._flag or self._closed:
                return
            self._flag = True
            try:
                os.write(self._write, b"x")
            except BlockingIOError:  # pragma: no cover - the pipe is full: already awake
                pass

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        """Only the waiting thread clears. It takes the lock set() holds while it
        flags and writes, so the flag and the pipe always agree: a byte left
        behind with the flag down would make every later wait, and every
        select() on fileno(), return at once."""
        if not self._flag:  # a set() in flight raises the flag before it writes, both under the lock
            return
        with self._lock:
            if self._closed:
                return
            self._flag = False
            try:
                os.read(self._read, 512)
            except BlockingIOError:
                pass

    def wait(self, timeout: float | None) -> bool:
        """Block until set or ``timeout`` seconds pass; True when set."""
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        try:
            select.select([self._read], [], [], timeout)
        except (OSError, ValueError):  # closed underneath us
            return True
        return self._flag

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()
