"""Jobs the SQS tests run, in-process and in worker subprocesses."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from rainier_sync import Job, JobContext, JobRegistry, backoff

lock = threading.Lock()
runs: list[tuple[str, int]] = []


@dataclass
class Note(Job):
    """Records that it ran (tag, attempt)."""

    NAME = "tests.sqs.note"
    TRIES = 3

    tag: str = ""
    seconds: float = 0.0

    def handle(self, context: JobContext) -> None:
        if self.seconds:
            time.sleep(self.seconds)
        with lock:
            runs.append((self.tag, context.attempt))


@dataclass
class Flaky(Job):
    """Fails until attempt ``succeed_on``."""

    NAME = "tests.sqs.flaky"
    TRIES = 3
    BACKOFF = backoff.fixed(0)

    tag: str = ""
    succeed_on: int = 2

    def handle(self, context: JobContext) -> None:
        with lock:
            runs.append((self.tag, context.attempt))
        if context.attempt < self.succeed_on:
            raise RuntimeError(f"attempt {context.attempt} fails")


@dataclass
class Marked(Job):
    """Writes ``start N`` to a file, waits for a ``go`` file (at most 60 s), writes ``done N``."""

    NAME = "tests.sqs.marked"
    TRIES = 3

    directory: str = ""
    wait: ClassVar[float] = 60.0

    def handle(self, context: JobContext) -> None:
        log = os.path.join(self.directory, "log")
        with open(log, "a") as out:
            out.write(f"start {context.attempt} {os.getpid()}\n")
        deadline = time.monotonic() + self.wait
        while not os.path.exists(os.path.join(self.directory, "go")) and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(log, "a") as out:
            out.write(f"done {context.attempt} {os.getpid()}\n")


def append_line(path: str, line: str) -> None:
    """One write to a file opened for appending: lines from many processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@dataclass
class Ledger(Job):
    """Appends ``n attempt pid`` to the ledger file at ``path``."""

    NAME = "tests.sqs.ledger"
    TRIES = 5

    path: str = ""
    n: int = 0

    def handle(self, context: JobContext) -> None:
        append_line(self.path, f"{self.n} {context.attempt} {os.getpid()}")


@dataclass
class OneTry(Job):
    """A ``TRIES = 1`` ledger job; with ``hold``, it creates ``hold + '.started'``
    and waits (at most 60 s) for the file ``hold`` before its ledger line."""

    NAME = "tests.sqs.one-try"
    TRIES = 1

    path: str = ""
    n: int = 0
    hold: str = ""

    def handle(self, context: JobContext) -> None:
        if self.hold:
            append_line(self.hold + ".started", str(os.getpid()))
            deadline = time.monotonic() + 60
            while not os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.02)
        append_line(self.path, f"{self.n} {context.attempt} {os.getpid()}")


def registry() -> JobRegistry:
    return JobRegistry().with_job(Note).with_job(Flaky).with_job(Marked).with_job(Ledger).with_job(OneTry)
