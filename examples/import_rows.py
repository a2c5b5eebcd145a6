"""An import as a batch: one job per row, a summary job when every row is done.

Run it with ``python examples/import_rows.py``. It queues a batch of 200 row
jobs (a few rows are bad and fail; ``allow_failures()`` lets the others go
on) with a summary job as its ``finally_``, runs a worker in a background
thread, and shows the batch's progress while it runs: one line rewritten in
place on a terminal, a line at each quarter otherwise. Then it prints the
batch's counts and what the summary job wrote. A batch keeps its counts in a
lock store; the memory one is shared by this process only, which is all an
embedded worker needs.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.batch import Batch
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore

ROWS = 200
#: The rows that cannot be imported.
BAD_ROWS = frozenset({37, 88, 141, 190})
BAR_WIDTH = 30


class Table:
    """Where the rows go: a pretend database table."""

    def __init__(self) -> None:
        self.rows: dict[int, str] = {}
        self.summary: list[str] = []
        self.summarised = threading.Event()
        self._lock = threading.Lock()

    def insert(self, number: int, value: str) -> None:
        with self._lock:
            self.rows[number] = value


@dataclass
class ImportRow(Job):
    NAME = "imports.row"

    number: int

    def handle(self, context: JobContext) -> None:
        if self.number in BAD_ROWS:
            raise ValueError(f"row {self.number}: the email column is empty")
        time.sleep(0.002)  # the work of parsing and storing one row
        context.resolve(Table).insert(self.number, f"customer {self.number}")


@dataclass
class SummariseImport(Job):
    NAME = "imports.summarise"

    label: str

    def handle(self, context: JobContext) -> None:
        table = context.resolve(Table)
        missing = sorted(set(range(ROWS)) - set(table.rows))
        table.summary.append(f"{self.label}: {len(table.rows)} rows imported")
        table.summary.append(f"{self.label}: rows not imported: {', '.join(map(str, missing)) or 'none'}")
        table.summarised.set()


def bar(batch: Batch) -> str:
    done = batch.total - max(batch.pending, 0)
    filled = round(BAR_WIDTH * batch.progress)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{batch.total} rows, {batch.failed} failed"


def watch(manager: QueueManager, batch_id: str) -> Batch:
    """Show the batch's progress until every job has finished; the batch as last read."""
    tty = sys.stdout.isatty()
    quarters_shown = 0
    pause = threading.Event()
    while True:
        batch = manager.find_batch(batch_id)
        assert batch is not None, "kept for 7 days, far longer than this import"
        if tty:
            print(f"\r{bar(batch)}", end="", flush=True)
        else:
            while quarters_shown < 4 and batch.progress >= (quarters_shown + 1) / 4:
                quarters_shown += 1
                print(f"reached {quarters_shown * 25}%: {bar(batch)}", flush=True)
        if batch.finished:
            if tty:
                print()
            return batch
        pause.wait(0.05)


def main() -> int:
    # The bad rows' failures are expected: the summary reports them, so the log need not.
    logging.getLogger("rainier_sync").addHandler(logging.NullHandler())
    table = Table()
    manager = QueueManager(
        connections={"main": MemoryQueue()},
        registry=JobRegistry().with_job(ImportRow).with_job(SummariseImport),
        container=Container().instance(Table, table),
        locks=MemoryLockStore(),
    )
    batch = (
        manager.batch([ImportRow(n) for n in range(ROWS)], name="customers.csv")
        .allow_failures()
        .finally_(SummariseImport("customers.csv"))
        .dispatch()
    )
    worker = Worker(manager, options=WorkerOptions(concurrency=4, sleep=0.1))
    worker.start()
    try:
        done = watch(manager, batch.id)
        summarised = table.summarised.wait(10)
    finally:
        worker.stop()
        worker.join(10)
    print(
        f"batch {done.name}: total {done.total}, processed {done.processed}, failed {done.failed}, "
        f"skipped {done.skipped}, cancelled {'yes' if done.cancelled else 'no'}"
    )
    for line in table.summary:
        print(line)
    return 0 if summarised else 1


if __name__ == "__main__":
    raise SystemExit(main())
