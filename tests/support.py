"""Helpers shared by the test suite: real-server checks and bounded waits."""

from __future__ import annotations

import os
import socket
import time
from typing import Callable

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_service(what: str, how_to_start: str) -> None:
    """A server the test needs is not there: fail under CI, skip elsewhere."""
    message = f"{what} is not reachable; start it with: {how_to_start}"
    if IN_CI:
        pytest.fail(f"CI=true: {message}", pytrace=False)
    pytest.skip(message)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01, message: str = "condition"
) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def freeze_process(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped (Linux's
    /proc): the signal is only queued when ``kill`` returns, and on a busy machine
    a thread of the target can still answer a request after it."""
    import signal

    os.kill(pid, signal.SIGSTOP)
    tasks = f"/proc/{pid}/task"
    if not os.path.isdir(tasks):
        return  # no /proc to read: the signal's own promptness will do

    def stopped() -> bool:
        for task in os.listdir(tasks):
            try:
                with open(f"{tasks}/{task}/stat", encoding="ascii") as stat:
                    state = stat.read().rpartition(")")[2].split()[0]
            except OSError:
                continue  # the thread ended
            if state not in ("T", "t"):
                return False
        return True

    wait_until(stopped, timeout, 0.005, f"process {pid} to stop")
