"""A rate-limited API client: two workers share one limit through the lock store.

Run it with ``python examples/rate_limited.py``. It queues 12 jobs that each
call a pretend profile API allowed 5 calls a second, runs two workers of 4
threads each, and waits until every profile is fetched. Both workers live in
this process: the memory lock store is shared by one process only, and a
deferral needs a driver that puts a job back without spending its try, which
the memory driver does (see docs/middleware.rst).
``RateLimited`` defers the calls its window has no room for, without spending
their tries, so all 12 jobs run exactly once, never more than 5 in a second.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, signals
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore
from rainier_sync.middleware import RateLimited

#: The API's quota: calls per second.
API_LIMIT = 5
#: The limiter's window: a little longer than the quota's second, for the time between its check and the call.
WINDOW = 1.2
JOBS = 12


class ProfileApi:
    """A pretend remote API that records when each call arrives."""

    def __init__(self, expected: int) -> None:
        self.calls: list[tuple[float, int]] = []
        self.done = threading.Event()
        self._expected = expected
        self._lock = threading.Lock()

    def fetch(self, user_id: int) -> dict[str, Any]:
        with self._lock:
            self.calls.append((time.monotonic(), user_id))
            if len(self.calls) >= self._expected:
                self.done.set()
        return {"id": user_id, "name": f"user {user_id}"}

    def busiest_window(self, seconds: float) -> int:
        """The most calls that arrived within any ``seconds``."""
        times = sorted(t for t, _ in self.calls)
        return max((sum(1 for u in times[i:] if u - t < seconds) for i, t in enumerate(times)), default=0)


@dataclass
class FetchProfile(Job):
    NAME = "crm.fetch-profile"
    TRIES = 1  # a deferral spends no try: one is enough

    user_id: int

    def middleware(self) -> list[Any]:
        return [RateLimited("profile-api", limit=API_LIMIT, per=WINDOW)]

    def handle(self, context: JobContext) -> None:
        context.resolve(ProfileApi).fetch(self.user_id)


def main() -> int:
    api = ProfileApi(expected=JOBS)
    manager = QueueManager(
        connections={"main": MemoryQueue()},
        registry=JobRegistry().with_job(FetchProfile),
        container=Container().instance(ProfileApi, api),
        locks=MemoryLockStore(),  # where RateLimited keeps its window: every worker of the manager shares it
    )
    manager.dispatch_many([FetchProfile(user_id=n) for n in range(1, JOBS + 1)])

    reasons: set[str] = set()
    signals.job_deferred.connect(lambda sender, **event: reasons.add(event["reason"]), weak=False)

    workers = [Worker(manager, options=WorkerOptions(concurrency=4, sleep=0.1)) for _ in range(2)]
    for worker in workers:
        worker.start()
    finished = api.done.wait(30)
    for worker in workers:
        worker.stop()
    stats = [worker.join(10) for worker in workers]

    processed = sum(s.processed for s in stats)
    deferred = sum(s.deferred for s in stats)
    failed = sum(s.failed for s in stats)
    called = sorted(user_id for _, user_id in api.calls)
    busiest = api.busiest_window(1.0)
    print(f"fetched: {', '.join(map(str, called))}")
    print(f"busiest second: {busiest} call(s) (the API allows {API_LIMIT})")
    print(f"deferred {deferred} time(s): {'; '.join(sorted(reasons)) or 'never'}")
    print(f"processed {processed}, deferred {deferred}, failed {failed}")
    ok = finished and called == list(range(1, JOBS + 1)) and busiest <= API_LIMIT and failed == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
