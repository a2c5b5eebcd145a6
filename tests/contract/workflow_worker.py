"""A worker process for the workflow (chain and batch) process tests.

python -m tests.contract.workflow_worker KIND URL PREFIX CONCURRENCY RESERVATION LEDGER
python -m tests.contract.workflow_worker zygote KIND URL PREFIX CONCURRENCY RESERVATION LEDGER

KIND is ``redis`` (RedisQueue + RedisLockStore under PREFIX) or ``postgres``
(DatabaseQueue + its lock store on URL; PREFIX unused). A worker works the
queue :data:`~tests.contract.workflow_jobs.QUEUE` until SIGTERM, then writes its
stats to ``LEDGER/stats-<pid>.json``. Every job it skips is recorded in the
LEDGER directory (``skip <job id> <name> <pid>``); it says ``ready <pid>`` on
stderr once it is connected and has its signal handlers.

A ``zygote`` imports everything once, then forks a worker for each line it
reads on stdin, printing the worker's pid: a test starts (and replaces a
killed) worker in milliseconds, not in an interpreter's start-up.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from typing import Any

from rainier_sync import QueueManager, Worker, WorkerOptions, signals
from tests.contract import workflow_jobs


def connect(kind: str, url: str, prefix: str, reservation: float) -> tuple[Any, Any]:
    if kind == "redis":
        from rainier_sync.drivers import RedisQueue
        from rainier_sync.locks import RedisLockStore

        return RedisQueue.from_url(url, prefix=prefix, reservation=reservation), RedisLockStore.from_url(
            url, prefix=prefix + "lock:"
        )
    from rainier_sync.drivers.database import DatabaseQueue

    driver = DatabaseQueue.from_url(url, reservation=reservation)
    return driver, driver.lock_store()


def work(kind: str, url: str, prefix: str, concurrency: str, reservation: str, ledger: str) -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test that times out asks for the stacks
    driver, locks = connect(kind, url, prefix, float(reservation))
    manager = QueueManager({kind: driver}, locks=locks, registry=workflow_jobs.registry())
    options = WorkerOptions(
        queues=[workflow_jobs.QUEUE], concurrency=int(concurrency), sleep=0.05, reclaim_interval=0.1
    )
    worker = Worker(manager, options=options)

    def skipped(sender: Any, job: Any = None, **_: Any) -> None:
        workflow_jobs.record(ledger, "skip", job.id, job.name, os.getpid())

    signals.job_skipped.connect(skipped, weak=False)
    worker.install_signal_handlers()
    driver.size(workflow_jobs.QUEUE)  # connected before it says it is ready
    print(f"ready {os.getpid()}", file=sys.stderr, flush=True)  # a SIGTERM from here on stops it gracefully
    totals = asdict(worker.run())
    manager.close()
    stats = os.path.join(ledger, f"stats-{os.getpid()}.json")
    with open(stats + ".part", "w", encoding="utf-8") as out:
        json.dump(totals, out)
    os.replace(stats + ".part", stats)


def zygote(args: list[str]) -> int:
    """Fork a worker per line of stdin, printing its pid; reap them at the end."""
    children: list[int] = []
    for _ in sys.stdin:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                work(*args)
            except BaseException:  # noqa: BLE001 - said on stderr; the child exits either way
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
        print(pid, flush=True)
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "zygote":
        return zygote(argv[1:])
    work(*argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
