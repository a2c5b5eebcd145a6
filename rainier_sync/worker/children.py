"""The worker's handle on one supervised child process: its socket, its pidfd,
its messages, and how it is stopped."""

from __future__ import annotations

import os
import select
import signal
import socket
from typing import Any

from .. import _clock
from ..types import decode, encode
from .child import READ, kill_group


def _describe_status(status: int | None) -> str:
    if status is None:
        return "its exit status is unknown"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"it was killed by {name}"
    return f"it exited with code {code}"


# -- the parent side -----------------------------------------------------------------------


class _Child:
    """The parent's handle on one child process."""

    __slots__ = ("pid", "sock", "pidfd", "attempts", "buffer", "alive", "reaped", "poller")

    def __init__(self, pid: int, sock: socket.socket, pidfd: int | None) -> None:
        self.pid = pid
        self.sock = sock
        self.pidfd = pidfd
        self.attempts = 0
        self.buffer = bytearray()
        self.alive = True
        self.reaped = False
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(encode(message).encode() + b"\n")

    def next_message(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None when ``timeout`` passed first; EOFError when the child is gone."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                message = decode(line)
                if not isinstance(message, dict):
                    raise EOFError("the child sent something that is not a message")
                return message
            if not self.alive:
                raise EOFError("the child is gone")
            if not self.poller.poll(max(0, int(timeout * 1000 + 0.999))):
                return None
            try:
                data = self.sock.recv(READ)
            except OSError:
                data = b""
            if not data:
                self.alive = False
                raise EOFError("the child is gone")
            self.buffer += data
            timeout = 0.0

    def idle_and_alive(self) -> bool:
        """A child waiting for work has nothing to say: anything readable means it is gone."""
        return self.alive and not self.buffer and not self.poller.poll(0)

    def wait_gone(self, timeout: float, said: list[dict[str, Any]] | None = None) -> bool:
        """Read whatever the child still sends (kept in ``said``) until it exits; True once it has."""
        deadline = _clock.monotonic() + timeout
        while self.alive:
            left = deadline - _clock.monotonic()
            if left <= 0:
                return False
            try:
                message = self.next_message(left)
            except (EOFError, ValueError):
                self.alive = False
                break
            if message is not None and said is not None:
                said.append(message)
        return True

    def kill(self, sig: int) -> None:
        """Signal the child and every process it started: the child leads a process
        group of its own (made before its pid reached us), so a job's own
        subprocesses go with it. Once: a second SIGTERM would interrupt the
        child's clean-up after the first."""
        if kill_group(self.pid, sig):
            return
        try:  # no group left: the child alone, if it is still there
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.alive = False
        try:
            self.sock.close()
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
