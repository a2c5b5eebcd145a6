"""A worker process for the middleware process tests.

python -m tests.contract.middleware_worker MODE CONCURRENCY SLEEP LEDGER BACKEND...

BACKEND is what :meth:`tests.contract.processes.Backend.argv` gives (the
driver and lock store of the test's place on a real server, and its queue).
MODE ``once`` runs ``--once`` passes until the queue's size is 0 (ready,
delayed and reserved: a deferred job keeps it above 0), at most
:data:`ONCE_FOR` seconds; ``forever`` runs until SIGTERM. Prints the summed
stats as one JSON line. Once its worker is built it notes ``LEDGER/ready-<pid>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rainier_sync import QueueManager, Worker, WorkerOptions
from tests.contract import middleware_jobs
from tests.contract.processes import from_argv

#: The longest a ``once`` process keeps running passes before it gives up.
ONCE_FOR = 120.0


def main(argv: list[str]) -> int:
    mode, concurrency, sleep, ledger = argv[:4]
    driver, locks, queue = from_argv(argv[4:])
    manager = QueueManager({argv[4]: driver}, locks=locks, registry=middleware_jobs.registry())
    options = {"queues": [queue], "concurrency": int(concurrency), "sleep": float(sleep), "reclaim_interval": 0.5}
    totals: dict[str, int] = {}
    code = 0
    ready = Path(ledger) / f"ready-{os.getpid()}"
    if mode == "once":
        ready.touch()
        ends = time.monotonic() + ONCE_FOR
        passes = 0
        while True:
            stats = Worker(manager, options=WorkerOptions(once=True, **options)).run()
            passes += 1
            for name, value in asdict(stats).items():
                totals[name] = totals.get(name, 0) + value
            if driver.size(queue) == 0:
                break
            if time.monotonic() > ends:
                code = 1
                break
            time.sleep(float(sleep))  # what is left is delayed (deferred) or held by the other process
        totals["passes"] = passes
    else:
        worker = Worker(manager, options=WorkerOptions(**options))
        worker.install_signal_handlers()
        ready.touch()
        totals = asdict(worker.run())
    manager.close()
    print(json.dumps(totals), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
