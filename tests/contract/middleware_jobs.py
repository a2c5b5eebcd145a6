"""Jobs the middleware process tests run in worker subprocesses.

Each appends one line to a ledger file of its own process under the test's
directory (``<ledger>/<pid>.log``), so the test can merge what every worker did.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from rainier_sync import Job, JobContext, JobRegistry
from rainier_sync.middleware import RateLimited, WithoutOverlapping

_write = threading.Lock()


def record(ledger: str, *fields: object) -> None:
    """Append one line of ``fields`` to this process's ledger file."""
    line = " ".join(str(field) for field in fields) + "\n"
    with _write, open(os.path.join(ledger, f"{os.getpid()}.log"), "a", encoding="utf-8") as out:
        out.write(line)


@dataclass
class Limited(Job):
    """Records ``n before after attempt`` under ``RateLimited(limiter, limit, per)``:
    its start was granted between ``before`` (the chain began) and ``after``
    (``handle`` began), however long the process was kept off the CPU."""

    NAME = "mw-processes.limited"

    ledger: str = ""
    n: int = 0
    limiter: str = "api"
    limit: int = 1
    per: float = 1.0

    def middleware(self) -> list[Any]:
        return [Before(), RateLimited(self.limiter, limit=self.limit, per=self.per)]

    def handle(self, context: JobContext) -> None:
        after = time.time()
        record(self.ledger, self.n, repr(getattr(self, "before", after)), repr(after), context.attempt)


class Before:
    """Notes on the job when its middleware chain began."""

    def handle(self, job: Any, context: JobContext, call_next: Any) -> None:
        job.before = time.time()
        call_next()


@dataclass
class Exclusive(Job):
    """Holds its key for ``hold`` seconds; records ``n key start end attempt pid``.

    With ``hang`` set, its first attempt records ``hanging n key before pid``
    (``before``: when its chain began, so before it took the lock) and then
    sleeps far longer than any test waits (the test kills its process).
    """

    NAME = "mw-processes.exclusive"
    #: A job its killed worker had claimed comes back on its next try.
    TRIES = 3

    ledger: str = ""
    n: int = 0
    key: str = ""
    hold: float = 0.02
    expire_after: float = 30.0
    release_after: float = 0.05
    hang: bool = False

    def middleware(self) -> list[Any]:
        overlap = WithoutOverlapping(self.key, expire_after=self.expire_after, release_after=self.release_after)
        return [Before(), overlap]

    def handle(self, context: JobContext) -> None:
        start = time.time()
        if self.hang and context.attempt == 1:
            # when its chain began: the lock was taken after this (and lapses expire_after after that)
            record(self.ledger, "hanging", self.n, self.key, repr(getattr(self, "before", start)), os.getpid())
            time.sleep(120)
            return
        time.sleep(self.hold)
        record(self.ledger, self.n, self.key, repr(start), repr(time.time()), context.attempt, os.getpid())


@dataclass
class Plain(Job):
    """Records ``n start``."""

    NAME = "mw-processes.plain"

    ledger: str = ""
    n: int = 0

    def handle(self, context: JobContext) -> None:
        record(self.ledger, self.n, repr(time.time()))


def registry() -> JobRegistry:
    return JobRegistry().with_job(Limited).with_job(Exclusive).with_job(Plain)
