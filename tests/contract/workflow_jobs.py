"""Jobs the workflow process tests run in worker subprocesses.

Each appends one line to a ledger file of its own process under the test's
directory (``<ledger>/<pid>.log``), so the test can merge what every worker did.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from rainier_sync import Job, JobContext, JobRegistry

_write = threading.Lock()

#: The queue every job here goes to unless its dispatch names another.
QUEUE = "wf-processes"


def record(ledger: str, *fields: object) -> None:
    """Append one line of ``fields`` to this process's ledger file."""
    line = " ".join(str(field) for field in fields) + "\n"
    with _write, open(os.path.join(ledger, f"{os.getpid()}.log"), "a", encoding="utf-8") as out:
        out.write(line)


@dataclass
class Step(Job):
    """A link of a chain: records ``begin step pid job start attempt`` and,
    after holding ``hold`` seconds, ``end step pid job end attempt``."""

    NAME = "wf-processes.step"
    QUEUE = QUEUE
    #: A killed worker spends a try of the job it held, and one link may be killed more than once.
    TRIES = 30

    ledger: str = ""
    step: int = 0
    hold: float = 0.1

    def handle(self, context: JobContext) -> None:
        record(self.ledger, "begin", self.step, os.getpid(), context.id, repr(time.time()), context.attempt)
        time.sleep(self.hold)
        record(self.ledger, "end", self.step, os.getpid(), context.id, repr(time.time()), context.attempt)


@dataclass
class Noop(Job):
    """A job of a batch: records ``job id start pid``, after sleeping ``hold`` seconds when it is set."""

    NAME = "wf-processes.noop"
    QUEUE = QUEUE
    TRIES = 5

    ledger: str = ""
    hold: float = 0.0

    def handle(self, context: JobContext) -> None:
        record(self.ledger, "job", context.id, repr(time.time()), os.getpid())
        if self.hold:
            time.sleep(self.hold)


@dataclass
class Callback(Job):
    """A batch's callback: records ``callback which id pid``."""

    NAME = "wf-processes.callback"
    QUEUE = QUEUE
    TRIES = 3

    ledger: str = ""
    which: str = ""

    def handle(self, context: JobContext) -> None:
        record(self.ledger, "callback", self.which, context.id, os.getpid())


def registry() -> JobRegistry:
    return JobRegistry().with_job(Step).with_job(Noop).with_job(Callback)
