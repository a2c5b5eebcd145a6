"""A scheduling worker process for tests/contract/test_schedule_processes.py.

python -m tests.contract.schedule_worker {postgres|redis} URL PREFIX LEDGER_DIR [KILL_AT [go]]

It schedules :class:`Beat` ``every(1)`` and runs the queue (sleep 0.2,
concurrency 2) until SIGTERM. With ``KILL_AT`` = N > 0 it SIGKILLs itself at
its Nth tick claim, after the tick's job was dispatched and before the claim
is written, first noting ``killed <key> <job id> <pid>`` in its ledger. With
``go`` it builds its worker, notes ``built <pid>``, and starts it once the file
``LEDGER_DIR/go`` names a time (seconds since the epoch) and that time came.

Each process appends to ``LEDGER_DIR/<pid>.log``: ``ready <pid>`` once the
worker is built, and a line per run of :class:`Beat`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Schedule, Worker, WorkerOptions, _clock
from rainier_sync.locks import LockStore
from rainier_sync.schedule import Entry

ENTRY = "beat"
INTERVAL = 1.0
#: Ticks a run looks back for the one it holds (a run seldom starts more than a few after its tick).
LOOK_BACK = 300
RESERVATION = 3.0


def ledger(directory: str) -> Path:
    return Path(directory) / f"{os.getpid()}.log"


def note(directory: str, line: str) -> None:
    with open(ledger(directory), "a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def lock_store(backend: str, url: str, prefix: str, kill_at: int = 0, directory: str = "") -> LockStore:
    """The shared lock store; one whose ``kill_at``-th tick claim kills the process when asked."""
    base: type[LockStore]
    if backend == "postgres":
        from rainier_sync.locks import DatabaseLockStore

        base = DatabaseLockStore
    else:
        from rainier_sync.locks import RedisLockStore

        base = RedisLockStore
    made = killing(base, kill_at, directory) if kill_at else base
    if backend == "postgres":
        return made.from_url(url)  # type: ignore[attr-defined,no-any-return]
    return made.from_url(url, prefix=prefix + "lock:")  # type: ignore[attr-defined,no-any-return]


_stores = threading.local()


@dataclass
class Beat(Job):
    """Appends ``beat <tick> <job id> <pid> <ran at>`` to this process's ledger.

    The tick is the one whose key in the lock store this job holds: the job runs
    only once its TickGuard found the key its own (``rainier_sync.schedule``),
    so the key is the truth of which tick a run belongs to, however late it runs.
    """

    NAME = "schedule-tests.beat"
    #: A worker SIGKILLed holding a job spends one attempt of it (a job on its last attempt then fails
    #: with JobCrashedError): with one try, a run the kills interrupt would be lost by the queue's rules.
    TRIES = 3

    backend: str
    url: str
    prefix: str
    ledger: str

    def handle(self, context: JobContext) -> None:
        store = getattr(_stores, "store", None)
        if store is None:
            store = _stores.store = lock_store(self.backend, self.url, self.prefix)
        entry = Entry(ENTRY, self, every=INTERVAL)
        now = _clock.now()
        latest = math.floor(now / INTERVAL) * INTERVAL
        tick = "none"
        for back in range(LOOK_BACK):
            candidate = latest - back * INTERVAL
            if store.owner(entry.key(candidate)) == context.id:
                tick = f"{candidate:.0f}"
                break
        note(self.ledger, f"{ENTRY} {tick} {context.id} {os.getpid()} {now:.3f}")


MINUTELY = "minutely"


@dataclass
class Minute(Beat):
    """A ``* * * * *`` entry's job: ``minutely <tick> <job id> <pid> <ran at>``."""

    NAME = "schedule-tests.minute"

    def handle(self, context: JobContext) -> None:
        store = getattr(_stores, "store", None)
        if store is None:
            store = _stores.store = lock_store(self.backend, self.url, self.prefix)
        entry = Entry(MINUTELY, self, cron="* * * * *")
        now = _clock.now()
        latest = math.floor(now / 60) * 60
        tick = "none"
        for back in range(5):
            if store.owner(entry.key(latest - back * 60)) == context.id:
                tick = f"{latest - back * 60:.0f}"
                break
        note(self.ledger, f"{MINUTELY} {tick} {context.id} {os.getpid()} {now:.3f}")


def killing(base: type[LockStore], kill_at: int, directory: str) -> type[LockStore]:
    """``base`` whose Nth tick claim by the scheduler kills the process instead."""

    class Killing(base):  # type: ignore[valid-type,misc]
        claims = 0

        def acquire(self, key: str, owner: str, ttl: float) -> bool:
            if key.startswith(f"schedule:{ENTRY}:") and sys._getframe(1).f_code.co_name == "_dispatch":
                Killing.claims += 1
                if Killing.claims >= kill_at:
                    note(directory, f"killed {key} {owner} {os.getpid()}")
                    os.kill(os.getpid(), signal.SIGKILL)
            return bool(super().acquire(key, owner, ttl))

    return Killing


def main(argv: list[str]) -> int:
    backend, url, prefix, directory = argv[:4]
    logging.basicConfig(
        filename=str(Path(directory) / f"{os.getpid()}.txt"),
        level=logging.INFO,
        format="%(created).3f %(threadName)s %(levelname)s %(message)s",
    )
    kill_at = int(argv[4]) if len(argv) > 4 else 0
    wait_for_go = len(argv) > 5 and argv[5] == "go"
    registry = JobRegistry()
    registry.register(Beat)
    registry.register(Minute)
    driver: Any
    if backend == "postgres":
        from rainier_sync.drivers.database import DatabaseQueue

        driver = DatabaseQueue.from_url(url, reservation=RESERVATION)
    else:
        from rainier_sync.drivers import RedisQueue

        driver = RedisQueue.from_url(url, prefix=prefix + "queue:", reservation=RESERVATION)
    locks = lock_store(backend, url, prefix, kill_at, directory)
    schedule = (
        Schedule()
        .every(INTERVAL, Beat(backend, url, prefix, directory), name=ENTRY)
        .cron("* * * * *", Minute(backend, url, prefix, directory), name=MINUTELY)
    )
    manager = QueueManager({"main": driver}, registry=registry, container=Container(), locks=locks, schedule=schedule)
    worker = Worker(
        manager,
        options=WorkerOptions(schedule=True, sleep=0.2, concurrency=2, reclaim_interval=0.5, queues=["default"]),
    )
    worker.install_signal_handlers()
    if wait_for_go:
        note(directory, f"built {os.getpid()}")
        go = Path(directory) / "go"
        deadline = time.monotonic() + 120
        while not go.exists() or not go.read_text().strip():
            if time.monotonic() > deadline:
                return 1
            time.sleep(0.01)
        time.sleep(max(0.0, float(go.read_text()) - time.time()))
    note(directory, f"ready {os.getpid()}")
    stats = worker.run()
    manager.close()
    print(f"processed={stats.processed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
