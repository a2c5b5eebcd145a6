"""The worker: one owning loop talks to the backend, a thread pool runs handlers.

The owning loop claims jobs for free threads (a batch per round trip),
acknowledges completions in batches, renews reservations of running jobs
(heartbeats), reclaims lapsed reservations now and then, and sleeps on a
:class:`~rainier_sync.drivers.base.Waker` that the backend, a finishing job or
:meth:`Worker.stop` can set. Pool threads only run handlers, so a driver needs
one connection per worker process, not one per thread.
"""

from __future__ import annotations

import collections
import logging
import queue as queue_module
import signal
import threading
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Sequence

from . import _clock, signals
from ._execution import ABANDONED, FAILED, PROCESSED, RELEASED, Completion, Executor
from ._supervisor import Supervisor, load_child_setup, supported
from .errors import ConfigurationError, QueueUnavailableError
from .types import ExceptionInfo, QueuedJob

if TYPE_CHECKING:
    from .container import Container
    from .drivers.base import BaseQueue
    from .manager import QueueManager
    from .registry import JobRegistry

__all__ = ["Worker", "WorkerOptions", "WorkerStats"]

log = logging.getLogger("rainier_sync")

#: Backend failures in a row after which a ``once`` worker gives up.
ONCE_GIVE_UP = 6


def _positive(name: str, value: Any, *, allow_zero: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigurationError(
            f"worker option {name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}"
        )


@dataclass
class WorkerOptions:
    """How a worker runs.

    - ``queues``: tried in this order (all of the first before any of the next).
    - ``concurrency``: threads running handlers.
    - ``sleep``: longest idle wait, in seconds (the backend usually wakes it sooner).
    - ``max_jobs``: stop after taking this many jobs (a worker that recycles).
    - ``timeout``: seconds an attempt may run when its job sets no ``TIMEOUT``;
      a timed attempt runs in a supervised child process. None: no limit.
    - ``once``: run what is due, then return (the cron mode).
    - ``grace``: seconds running jobs get to finish after :meth:`Worker.stop`.
    - ``heartbeat``: seconds between reservation renewals (default: a third
      of the driver's reservation).
    - ``reclaim_interval``: seconds between sweeps for lapsed reservations.
    - ``max_jobs_per_child``: attempts a timeout child runs before it is replaced.
    - ``child_setup``: ``"package.module:function"`` called in each new timeout
      child before its first attempt, to reopen what must not be shared across
      a fork; it may return a :class:`~rainier_sync.Container` for the child to
      use instead of the inherited one.
    """

    queues: Sequence[str] = ("default",)
    concurrency: int = 8
    sleep: float = 1.0
    max_jobs: int | None = None
    timeout: float | None = None
    once: bool = False
    connection: str | None = None
    grace: float = 30.0
    heartbeat: float | None = None
    reclaim_interval: float = 60.0
    max_jobs_per_child: int | None = 1000
    child_setup: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.queues, str):
            self.queues = [q for q in self.queues.split(",") if q]
        self.queues = list(self.queues)
        if not self.queues or not all(isinstance(q, str) and q for q in self.queues):
            raise ConfigurationError(f"worker option queues must be non-empty queue names, got {self.queues!r}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ConfigurationError(f"worker option concurrency must be an int >= 1, got {self.concurrency!r}")
        if self.max_jobs is not None and (
            isinstance(self.max_jobs, bool) or not isinstance(self.max_jobs, int) or self.max_jobs < 1
        ):
            raise ConfigurationError(f"worker option max_jobs must be an int >= 1 or None, got {self.max_jobs!r}")
        _positive("sleep", self.sleep, allow_zero=True)
        _positive("timeout", self.timeout, allow_none=True)
        _positive("grace", self.grace, allow_zero=True)
        _positive("heartbeat", self.heartbeat, allow_none=True)
        _positive("reclaim_interval", self.reclaim_interval)
        _positive("max_jobs_per_child", self.max_jobs_per_child, allow_none=True)
        load_child_setup(self.child_setup)


@dataclass
class WorkerStats:
    """What a worker run did: jobs ``processed`` (succeeded), ``released`` for
    another attempt, ``failed`` for good, and ``idles`` (waits on an empty queue)."""

    processed: int = 0
    released: int = 0
    failed: int = 0
    idles: int = 0


class Worker:
    """Runs jobs from one connection of a :class:`~rainier_sync.QueueManager`.

    ``run()`` blocks until stopped (or, with ``once``, until nothing is due);
    ``start()``/``stop()``/``join()`` embed it in a service.
    """

    def __init__(
        self,
        manager: QueueManager,
        registry: JobRegistry | None = None,
        container: Container | None = None,
        options: WorkerOptions | None = None,
        *,
        connection: str | None = None,
    ) -> None:
        from .drivers.base import Waker

        self.manager = manager
        self.options = options or WorkerOptions()
        self.registry = registry if registry is not None else manager.registry
        self.container = container if container is not None else manager.container
        self.connection_name = connection or self.options.connection or manager.default
        self.driver: BaseQueue = manager.connection(self.connection_name)
        self.executor = Executor(self.registry, self.container, locks=manager.locks, sender=self)
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._stopped_at: float | None = None
        self._waker = Waker()
        self._inbox: queue_module.SimpleQueue[tuple[QueuedJob, threading.Event] | None] = queue_module.SimpleQueue()
        self._done: collections.deque[Completion] = collections.deque()
        self._running: dict[str, QueuedJob] = {}
        # What running jobs see as context.stop_requested: one notice for all of
        # them (set by stop()), apart from the worker's own stop flag.
        self._stop_notice = threading.Event()
        self._unsettled: list[Completion] = []
        self._threads: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        self._taken = 0
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._supervisor: Supervisor | None = None
        self._supervisor_lock = threading.Lock()
        self._supervisor_warned = False
        self._child_setup = load_child_setup(self.options.child_setup)
        self._children_interrupted_at: float | None = None

    # -- control -----------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, grace: float | None = None) -> None:
        """Take no new job; let running ones finish (up to the grace period)."""
        if grace is not None:
            self.options.grace = grace
        if not self._stop.is_set():
            self._stopped_at = _clock.monotonic()
            self._stop.set()
        self._stop_notice.set()
        self._waker.set()

    def start(self) -> threading.Thread:
        """Run the worker in a background thread (for a service that embeds it)."""
        if self._thread is not None:
            raise RuntimeError("this worker was already started")
        self._thread = threading.Thread(
            target=self._run_in_thread, name=f"rainier-worker-{self.connection_name}", daemon=True
        )
        self._thread.start()
        return self._thread

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except Exception:  # noqa: BLE001 - logged; join() returns the stats so far
            log.exception("worker stopped by an error")

    def join(self, timeout: float | None = None) -> WorkerStats:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.stats

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully; a second one stops it
        without waiting for running jobs. Call from the main thread."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.stopping:
                log.warning("second stop signal: not waiting for running jobs")
                self.stop(grace=0)
            else:
                log.info("signal %s: stopping after running jobs finish", signal.Signals(signum).name)
                self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- the owning loop -----------------------------------------------------------
    def run(self) -> WorkerStats:
        """Work until stopped; with ``once``, until nothing is due. Returns the stats."""
        opts = self.options
        driver = self.driver
        reservation = driver.reservation
        beat = opts.heartbeat or (reservation / 3 if reservation else None)
        next_beat = self._next_beat = _clock.monotonic() + beat if beat else float("inf")
        next_reclaim = 0.0
        failures = 0
        self._start_pool()
        try:
            while True:
                self._waker.clear()
                now = _clock.monotonic()
                # Renew our own reservations before anything else, so neither a
                # reclaim sweep nor a backend that keeps failing to settle can let
                # them lapse under jobs this worker is still running.
                if beat is not None and now >= next_beat:
                    next_beat = self._next_beat = now + beat
                    if self._running or self._unsettled:
                        self._heartbeat()
                if now >= next_reclaim:
                    next_reclaim = now + opts.reclaim_interval
                    self._backend("reclaim_expired", driver.reclaim_expired)
                if not self._settle():
                    failures = self._backend_failed(failures)
                    continue
                if self._stop.is_set():
                    if not self._running and not self._unsettled:
                        break
                    if self._grace_over():
                        if self._interrupt_children():
                            self._waker.wait(0.05)
                            continue
                        self._abandon_running()
                        break
                    self._waker.wait(0.1)
                    continue
                limit = opts.concurrency - self._busy - len(self._unsettled)
                if opts.max_jobs is not None:
                    limit = min(limit, opts.max_jobs - self._taken)
                    if limit <= 0 and not self._running and not self._unsettled:
                        break
                jobs: list[QueuedJob] = []
                if limit > 0:
                    got = self._backend("reserve", driver.reserve_many, opts.queues, limit)
                    if got is None:
                        failures = self._backend_failed(failures)
                        continue
                    failures = 0
                    jobs = got
                for job in jobs:
                    self._hand_out(job)
                if jobs:
                    continue
                if limit > 0:
                    if opts.once and not self._running and not self._done:
                        break
                    if not self._running:
                        self.stats.idles += 1
                    busy = bool(self._running or self._unsettled)
                    wait = opts.sleep if beat is None or not busy else min(opts.sleep, max(0.0, next_beat - now))
                    try:
                        driver.wait_for_jobs(opts.queues, wait, self._waker)
                    except Exception as exc:  # noqa: BLE001 - reported; then sleep as if nothing had come
                        self._operation_failed("wait_for_jobs", exc)
                        self._waker.wait(wait)
                else:
                    self._waker.wait(None if beat is None else max(0.0, next_beat - now))
        finally:
            self._stop_pool()
        return self.stats

    def _backend_failed(self, failures: int) -> int:
        """Pause after a failed backend operation (longer each time, at most 5 s).

        A resident worker keeps trying for as long as it runs; a ``once`` worker
        (a cron run) gives up after ``ONCE_GIVE_UP`` failures in a row, so the
        run ends with an error instead of hanging until the next one starts.
        """
        failures += 1
        if self.options.once and failures >= ONCE_GIVE_UP:
            raise QueueUnavailableError(
                f"connection {self.connection_name!r} failed {failures} times in a row; giving up this --once run "
                f"(last error: {self._last_error})"
            )
        pause = min(0.05 * 2 ** min(failures, 7), 5.0)
        if self._running or self._unsettled:
            pause = min(pause, max(0.0, self._next_beat - _clock.monotonic()))  # never skip a heartbeat
        self._waker.wait(pause)
        return failures

    def _grace_over(self) -> bool:
        return self._stopped_at is not None and _clock.monotonic() - self._stopped_at >= self.options.grace

    def _hand_out(self, job: QueuedJob) -> None:
        self._running[job.id] = job
        self._taken += 1
        with self._busy_lock:
            self._busy += 1
        self._inbox.put((job, self._stop_notice))

    def _settle(self) -> bool:
        """Apply finished attempts to the backend; False when the backend failed."""
        while self._done:
            self._unsettled.append(self._done.popleft())
        if not self._unsettled:
            return True
        batch, self._unsettled = self._unsettled, []
        applied: list[Completion] = []
        try:
            self.executor.apply_many(self.driver, batch, applied)
        except Exception as exc:  # noqa: BLE001 - kept and retried; the reservation protects the job
            self._operation_failed("settle", exc)
            # apply_many is not transactional: retry only what it did not perform.
            performed = {id(c) for c in applied}
            self._unsettled = [c for c in batch if id(c) not in performed] + self._unsettled
            self._account(applied)
            return False
        self._account(batch)
        return True

    def _account(self, completions: Sequence[Completion]) -> None:
        """Count settled completions, and stop when a job raised SystemExit or KeyboardInterrupt."""
        for completion in completions:
            self._running.pop(completion.job.id, None)
            outcome = completion.outcome
            if outcome == PROCESSED:
                self.stats.processed += 1
            elif outcome == RELEASED:
                self.stats.released += 1
            elif outcome == FAILED:
                self.stats.failed += 1
            if completion.interrupted and not self._stop.is_set():
                log.warning("a job raised %s: stopping the worker", type(completion.exception).__name__)
                self.stop()

    def _heartbeat(self) -> None:
        jobs = list(self._running.values())
        if jobs:
            self._backend("extend", self.driver.extend, jobs, self.driver.reservation)

    def _interrupt_children(self) -> bool:
        """Once the grace period is over, stop the children still running attempts;
        True while those attempts are on their way back (to be released)."""
        supervisor = self._supervisor
        if supervisor is None or not supervisor.busy():
            return False
        if self._children_interrupted_at is None:
            self._children_interrupted_at = _clock.monotonic()
            supervisor.interrupt()
        return _clock.monotonic() - self._children_interrupted_at < supervisor.kill_grace + 5.0

    def _abandon_running(self) -> None:
        left = len(self._running)
        if left:
            log.warning(
                "grace period over: abandoning %d running job(s); their reservations will lapse "
                "and another worker will run them again",
                left,
            )
        self._running.clear()

    def _backend(self, operation: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported, retried by the loop with a backoff
            self._operation_failed(operation, exc)
            return None

    def _operation_failed(self, operation: str, exc: BaseException) -> None:
        info = ExceptionInfo.from_exception(exc)
        self._last_error = f"{operation}: {info.error}"
        log.error("queue operation %s on connection %r failed: %s", operation, self.connection_name, info.error)
        signals.emit(
            signals.queue_operation_failed,
            self,
            connection=self.connection_name,
            operation=operation,
            error=info.error,
            exception=info,
        )

    # -- the pool ----------------------------------------------------------------------
    def _start_pool(self) -> None:
        self._children_interrupted_at = None
        if self.options.timeout is not None or any(c.TIMEOUT is not None for c in self.registry.classes()):
            # Fork the fork server now, from this thread, while no pool thread is running.
            self._get_supervisor()
        for index in range(self.options.concurrency):
            thread = threading.Thread(target=self._pool_thread, name=f"rainier-job-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _stop_pool(self) -> None:
        for _ in self._threads:
            self._inbox.put(None)
        with self._supervisor_lock:
            supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.close()
        if self._busy:
            return  # abandoned jobs still hold their threads; they are daemons
        deadline = _clock.monotonic() + 1.0
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - _clock.monotonic()))
        self._threads.clear()

    def _pool_thread(self) -> None:
        inbox, done, waker = self._inbox, self._done, self._waker
        while True:
            item = inbox.get()
            if item is None:
                return
            job, stop_requested = item
            try:
                completion = self.run_attempt(job, stop_requested)
            except BaseException as exc:  # noqa: BLE001 - never lose a completion
                completion = Completion(job, ABANDONED, exception=exc, interrupted=True)
            with self._busy_lock:
                self._busy -= 1
            done.append(completion)
            waker.set()

    def attempt_timeout(self, job: QueuedJob) -> float | None:
        """The time limit of this attempt: its job's ``TIMEOUT``, else the worker's."""
        job_class = self.registry._jobs.get(job.name)
        limit = getattr(job_class, "TIMEOUT", None) if job_class is not None else None
        return limit if limit is not None else self.options.timeout

    def run_attempt(self, job: QueuedJob, stop_requested: threading.Event) -> Completion:
        """Run one attempt: in this thread, or in a supervised child when it has a time limit."""
        timeout = self.attempt_timeout(job)
        if timeout is not None:
            supervisor = self._get_supervisor()
            if supervisor is not None:
                completion: Completion = supervisor.run(job, timeout, stop_requested)
                return completion
        return self.executor.run(job, stop_requested)

    def _get_supervisor(self) -> Supervisor | None:
        """The child-process pool for timed attempts (None where it is not available)."""
        if self._supervisor is not None:
            return self._supervisor
        with self._supervisor_lock:
            if self._supervisor is None:
                if not supported():
                    if not self._supervisor_warned:
                        self._supervisor_warned = True
                        log.warning("this platform cannot fork supervised children: time limits are not enforced")
                    return None
                supervisor = Supervisor(self, child_setup=self._child_setup)
                supervisor.start()
                self._supervisor = supervisor
            return self._supervisor
