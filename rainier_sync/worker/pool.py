"""The worker's thread pool: claimed jobs wait in one line, threads take them in turn.

A thread that finishes a job takes the next one from the line without
sleeping, so a burst of short jobs runs back to back on whichever thread holds
the interpreter, instead of costing a thread wake-up (and a hand-over of the
GIL) per job. Idle threads park on a lock of their own; a thread that takes a
job while more are waiting unparks one more, so jobs that block (on I/O, a
lock, a child process) still get every thread within microseconds.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, TypeVar

if TYPE_CHECKING:
    from ..drivers.base import Waker
    from ..types import QueuedJob
    from .attempts import Attempts
    from .settle import Claims

__all__ = ["Pool", "Line"]

T = TypeVar("T")

log = logging.getLogger("rainier_sync")


class Pool(Generic[T]):
    """``size`` daemon threads calling ``run(item)`` for each item submitted."""

    def __init__(self, size: int, run: Callable[[T], None], *, name: str = "rainier-job") -> None:
        self._run = run
        self._ready: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        #: The parking locks of idle threads (held while the thread is parked).
        self._idle: list[threading.Lock] = []
        self._held = False
        self._closing = False
        #: Threads running an item now.
        self.busy = 0
        self._threads = [
            threading.Thread(target=self._thread, name=f"{name}-{index}", daemon=True) for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    # -- the owning side -----------------------------------------------------------------
    def submit(self, items: Iterable[T], key: Callable[[T], Any] | None = None) -> None:
        """Put ``items`` (in ``key`` order, if given) at the end of the line; with
        ``key``, an item that sorts before those waiting goes ahead of them (stably)."""
        items = list(items)
        with self._lock:
            ready = self._ready
            # Items come ordered; the line needs sorting only when the first of them
            # belongs ahead of what is already waiting.
            resort = key is not None and items and ready and key(items[0]) < key(ready[-1])
            ready.extend(items)
            if resort and key is not None:
                ordered = sorted(ready, key=key)
                ready.clear()
                ready.extend(ordered)
            wake = self._idle.pop() if ready and self._idle else None
        if wake is not None:
            wake.release()

    def waiting(self) -> int:
        """Items submitted and not yet taken by a thread."""
        return len(self._ready)

    def pause(self) -> None:
        """Start nothing more (safe from a signal handler: takes no lock)."""
        self._held = True

    @property
    def paused(self) -> bool:
        return self._held

    def hold(self) -> list[T]:
        """Start nothing more; return (and forget) the items not yet taken."""
        with self._lock:
            self._held = True
            taken = list(self._ready)
            self._ready.clear()
        return taken

    def close(self, timeout: float = 1.0) -> None:
        """Let the threads end once idle (a thread still running an item ends after it)."""
        with self._lock:
            self._closing = True
            idle, self._idle = self._idle, []
        for parked in idle:
            parked.release()
        if self.busy:
            return  # threads held by running items are daemons: nothing to wait for
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- the threads -----------------------------------------------------------------------
    def _take(self, parked: threading.Lock) -> T | None:
        while True:
            with self._lock:
                if self._closing:
                    return None
                if self._ready and not self._held:
                    item = self._ready.popleft()
                    self.busy += 1
                    wake = self._idle.pop() if self._ready and self._idle else None
                    break
                self._idle.append(parked)
            parked.acquire()  # until another thread releases it: a job came, or close()
        if wake is not None:
            wake.release()
        return item

    def _thread(self) -> None:
        parked = threading.Lock()
        parked.acquire()
        while True:
            item = self._take(parked)
            if item is None:
                return
            try:
                self._run(item)
            except BaseException:  # noqa: BLE001 - a thread lost would shrink the pool for good
                log.exception("a pool thread's work raised; the thread goes on")
            finally:
                with self._lock:
                    self.busy -= 1


class Line:
    """One worker's pool for a run: claimed jobs wait in line (by queue rank, then
    priority), pool threads run them and leave each completion with the claims,
    waking the owning loop when there is something for it to do."""

    def __init__(
        self,
        concurrency: int,
        attempts: Attempts,
        claims: Claims,
        waker: Waker,
        notice: threading.Event,
        queues: Iterable[str],
    ) -> None:
        self._concurrency = concurrency
        self._attempts = attempts
        self._claims = claims
        self._waker = waker
        #: What running jobs see as context.stop_requested.
        self._notice = notice
        self._rank = {queue: index for index, queue in enumerate(queues)}
        self._pool: Pool[QueuedJob] | None = None
        #: Jobs a pool thread took just as the worker stopped, and left unstarted.
        self._declined: collections.deque[QueuedJob] = collections.deque()
        #: Finished attempts at which a pool thread wakes the owning loop to settle and claim.
        self.refill_at = 1

    def start(self, stopped: Callable[[], bool]) -> None:
        """Start the threads (paused when ``stopped()`` once they are there)."""
        # Fork the fork server now, from this thread, while no pool thread is running.
        self._attempts.prepare()
        pool = self._pool = Pool(self._concurrency, self._run)
        if stopped():
            pool.pause()

    def close(self) -> None:
        """Stop the threads and the attempts' children."""
        pool, self._pool = self._pool, None
        self._attempts.close()
        if pool is not None:
            pool.close(timeout=1.0)

    @property
    def started(self) -> bool:
        return self._pool is not None

    @property
    def busy(self) -> int:
        """Threads running an attempt now."""
        pool = self._pool
        return pool.busy if pool is not None else 0

    def pause(self) -> None:
        """Start nothing more (safe from a signal handler: takes no lock)."""
        pool = self._pool
        if pool is not None:
            pool.pause()

    def waiting(self) -> int:
        """Jobs in line, not yet taken by a thread."""
        pool = self._pool
        assert pool is not None, "the pool runs while the loop does"
        return pool.waiting()

    def submit(self, jobs: list[QueuedJob]) -> None:
        pool = self._pool
        assert pool is not None, "the pool runs while the loop does"
        rank = self._rank
        pool.submit(jobs, key=lambda job: (rank.get(job.queue, 0), job.priority))

    def take_unstarted(self) -> list[QueuedJob]:
        """Start nothing more; the jobs waiting in line, and those a thread declined."""
        pool = self._pool
        assert pool is not None, "the pool runs while the loop does"
        taken = pool.hold()
        declined = self._declined
        while declined:
            taken.append(declined.popleft())
        return taken

    def _run(self, job: QueuedJob) -> None:
        """A pool thread's work: run one attempt, report it, and wake the owning
        loop when there is something for it to do."""
        pool = self._pool
        if pool is None or pool.paused:
            # Taken in the instant stop() paused the pool: it goes back unstarted.
            self._declined.append(job)
            self._waker.set()
            return
        completion = self._attempts.run(job, self._notice)
        done = self._claims.done
        done.append(completion)
        # A batch's worth finished, or nothing left to start: the loop has work. (It
        # also looks every ACK_DELAY while jobs wait in the line, so no wake-up is lost.)
        if len(done) >= self.refill_at or not pool.waiting():
            self._waker.set()
