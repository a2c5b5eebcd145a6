"""The worker: one owning loop talks to the backend, a thread pool runs handlers.

The owning loop claims jobs for free threads, plus a prefetch sized by how fast
jobs finish (a batch per round trip), acknowledges completions in batches (with
the next claim, where the driver can do both at once), renews reservations of
claimed jobs (heartbeats), reclaims lapsed reservations now and then, and
sleeps on a :class:`~rainier_sync.drivers.base.Waker` that the backend, a
finishing job or :meth:`Worker.stop` can set. Pool threads only run handlers,
so a driver needs one connection per worker process, not one per thread.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Sequence

from . import _clock, signals
from ._execution import ABANDONED, FAILED, INTERRUPTED, PROCESSED, RELEASED, Completion, Executor
from ._pool import Pool
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

#: Seconds of failing backend operations after which a ``once`` worker gives up (the default).
ONCE_GIVE_UP = 30.0
#: Seconds of work, at the jobs' measured pace, a worker claims ahead of its threads.
PREFETCH_WINDOW = 0.05
#: Seconds a finished job may wait to be acknowledged with the next batch while the worker is busy.
ACK_DELAY = 0.005


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
    - ``give_up``: with ``once``, seconds the backend may keep failing (every
      failed operation counts, from the first of a run of failures to the next
      success) before the run ends with
      :class:`~rainier_sync.errors.QueueUnavailableError`: long enough to ride
      out a blip, short enough that a cron run never overlaps the next one.
    - ``grace``: seconds running jobs get to finish after :meth:`Worker.stop`.
    - ``heartbeat``: seconds between reservation renewals (default: a third
      of the driver's reservation).
    - ``reclaim_interval``: seconds between sweeps for lapsed reservations.
    - ``max_jobs_per_child``: attempts a timeout child runs before it is replaced.
    - ``prefetch``: the most jobs claimed ahead of the threads, so that short
      jobs are claimed and acknowledged many to a round trip. The worker uses
      only as much of it as its threads would start within
      :data:`PREFETCH_WINDOW` at the jobs' measured pace, so long jobs are still
      claimed one per free thread and left for other workers. 0 claims only for
      free threads. ``None``: 8 per thread.
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
    give_up: float = ONCE_GIVE_UP
    connection: str | None = None
    grace: float = 30.0
    heartbeat: float | None = None
    reclaim_interval: float = 60.0
    max_jobs_per_child: int | None = 1000
    child_setup: str | None = None
    prefetch: int | None = None

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
        _positive("give_up", self.give_up, allow_zero=True)
        _positive("heartbeat", self.heartbeat, allow_none=True)
        _positive("reclaim_interval", self.reclaim_interval)
        _positive("max_jobs_per_child", self.max_jobs_per_child, allow_none=True)
        if self.prefetch is not None and (
            isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0
        ):
            raise ConfigurationError(f"worker option prefetch must be an int >= 0 or None, got {self.prefetch!r}")
        load_child_setup(self.child_setup)

    @property
    def most_ahead(self) -> int:
        """The prefetch limit in jobs (``prefetch``, or its default)."""
        return 8 * self.concurrency if self.prefetch is None else self.prefetch


@dataclass
class WorkerStats:
    """What a worker run did: jobs ``processed`` (succeeded), ``released`` for
    another attempt, ``failed`` for good, ``idles`` (waits on an empty queue),
    ``discarded`` (stored jobs that could not be read, moved to the failed
    store), ``deferred`` and ``skipped`` (by a job's middleware), and
    ``interrupted`` (attempts cut short by :meth:`Worker.stop`, handed back
    without spending a try)."""

    processed: int = 0
    released: int = 0
    failed: int = 0
    idles: int = 0
    discarded: int = 0
    deferred: int = 0
    skipped: int = 0
    interrupted: int = 0


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
        self._pool: Pool[QueuedJob] | None = None
        #: Attempts finished by pool threads, not yet seen by the owning loop.
        self._done: collections.deque[Completion] = collections.deque()
        #: Every job claimed and not yet settled: waiting in the pool, running, or finished.
        self._running: dict[int, QueuedJob] = {}  # by the claimed object: a job id may come twice
        # What running jobs see as context.stop_requested: one notice for all of
        # them (set by stop()), apart from the worker's own stop flag.
        self._stop_notice = threading.Event()
        #: Finished attempts the owning loop has yet to apply to the backend.
        self._unsettled: list[Completion] = []
        self._unsettled_since = 0.0
        #: Claimed jobs that never started, to hand back at stop.
        self._unstarted: list[QueuedJob] = []
        #: Jobs a pool thread took just as the worker stopped, and left unstarted.
        self._declined: collections.deque[QueuedJob] = collections.deque()
        #: A stop asked for by a signal handler (its grace), for the owning loop to carry out.
        self._signalled: tuple[float | None] | None = None
        self._thread: threading.Thread | None = None
        self._taken = 0
        #: Finished attempts at which a pool thread wakes the owning loop to settle and claim.
        self._refill_at = 1
        #: The recent mean duration of an attempt (seconds), for sizing the prefetch.
        self._pace: float | None = None
        self._rank = {queue: index for index, queue in enumerate(self.options.queues)}
        from .drivers.base import BaseQueue as _Base

        self._combined = type(self.driver).acknowledge_and_reserve is not _Base.acknowledge_and_reserve
        # Claiming ahead needs a driver that can hand unstarted jobs back uncounted
        # at stop; with the default give_back (a release) each would spend an attempt.
        self._may_claim_ahead = type(self.driver).give_back is not _Base.give_back
        self._supervisor: Supervisor | None = None
        self._supervisor_lock = threading.Lock()
        self._supervisor_warned = False
        self._child_setup = load_child_setup(self.options.child_setup)
        self._children_interrupted_at: float | None = None
        self._last_error = ""
        #: When the backend's current run of failures began (None: its last operation worked).
        self._failing_since: float | None = None
        #: The owning loop's thread: discards it hears of while claiming are this worker's.
        self._loop_thread: int | None = None

    # -- control -----------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, grace: float | None = None) -> None:
        """Take no new job; let running ones finish (up to the grace period).
        Jobs claimed ahead and not started go back to the queue."""
        if grace is not None:
            self.options.grace = grace
        if not self._stop.is_set():
            self._stopped_at = _clock.monotonic()
            self._stop.set()
        pool = self._pool
        if pool is not None:
            pool.pause()
        self._stop_notice.set()
        self._waker.set()

    def _stop_from_signal(self, grace: float | None) -> None:
        """:meth:`stop` for a signal handler, taking no lock a handler could find
        held by the very thread it interrupted (an Event's, the pool's): the
        owning loop carries the stop out as soon as it wakes."""
        self._signalled = (grace,)
        pool = self._pool
        if pool is not None:
            pool.pause()
        self._waker.set()  # re-entrant

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
            if self.stopping or self._signalled is not None:
                log.warning("second stop signal: not waiting for running jobs")
                self._stop_from_signal(0.0)
            else:
                log.info("signal %s: stopping after running jobs finish", signal.Signals(signum).name)
                self._stop_from_signal(None)

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
        self._failing_since = None
        self._loop_thread = threading.get_ident()
        signals.queue_message_discarded.connect(self._heard_discard, sender=driver, weak=False)
        pool = self._start_pool()
        try:
            while True:
                self._waker.clear()
                if opts.once:
                    self._check_give_up()
                signalled, self._signalled = self._signalled, None
                if signalled is not None:
                    self.stop(signalled[0])
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
                self._collect(now)
                if self._stop.is_set():
                    self._gather_unstarted(pool)
                    handed_back = self._give_back()
                    settled = self._settle()
                    if handed_back and settled and not self._running and not self._unsettled:
                        break
                    if self._grace_over():
                        if self._interrupt_children():
                            self._waker.wait(0.05)
                            continue
                        self._abandon_running()
                        break
                    if not (handed_back and settled):
                        failures = self._backend_failed(failures)
                        continue
                    self._waker.wait(0.1)
                    continue
                capacity, refill = self._capacity()
                waiting = pool.waiting()
                limit = capacity - len(self._running) + len(self._unsettled)
                if opts.max_jobs is not None:
                    limit = min(limit, opts.max_jobs - self._taken)
                    if limit <= 0 and not self._running and not self._unsettled:
                        break
                if limit <= 0 or (limit < refill and waiting):
                    # Nothing worth a round trip yet: settle only what should not wait longer.
                    if self._unsettled and (
                        not waiting or len(self._unsettled) >= refill or now - self._unsettled_since >= ACK_DELAY
                    ):
                        if not self._settle():
                            failures = self._backend_failed(failures)
                        continue
                    # Pool threads wake this loop when the line runs dry or a batch's
                    # worth has finished; in between it looks again every ACK_DELAY.
                    timeout = None if beat is None else max(0.0, next_beat - now)
                    if self._unsettled:
                        timeout = max(0.0, self._unsettled_since + ACK_DELAY - now)
                    elif waiting:
                        timeout = ACK_DELAY if timeout is None else min(timeout, ACK_DELAY)
                    self._waker.wait(timeout)
                    continue
                discarded = self.stats.discarded
                jobs = self._settle_and_claim(limit)
                if jobs is None:
                    failures = self._backend_failed(failures)
                    continue
                failures = 0
                self._failing_since = None
                if jobs:
                    self._hand_out(pool, jobs)
                    continue
                if self.stats.discarded > discarded:
                    continue  # the claim met only unreadable jobs: jobs due behind them may be waiting
                if opts.once and not self._running and not self._done:
                    break
                if pool.waiting():
                    self._waker.wait(ACK_DELAY)  # the backend has no more; the line is still running down
                    continue
                if not self._running:
                    self.stats.idles += 1
                busy = bool(self._running or self._unsettled)
                wait = opts.sleep if beat is None or not busy else min(opts.sleep, max(0.0, next_beat - now))
                try:
                    driver.wait_for_jobs(opts.queues, wait, self._waker)
                except Exception as exc:  # noqa: BLE001 - reported; then sleep as if nothing had come
                    self._operation_failed("wait_for_jobs", exc)
                    self._waker.wait(wait)
        finally:
            signals.queue_message_discarded.disconnect(self._heard_discard)
            self._stop_notice.set()
            self._gather_unstarted(pool)
            if self._unstarted and not self._give_back():
                log.warning(
                    "%d job(s) claimed ahead could not be handed back; they run again once their reservations lapse",
                    len(self._unstarted),
                )
            self._stop_pool()
            try:
                self.driver.worker_stopped()
            except Exception as exc:  # noqa: BLE001 - what the driver held comes back when its reservations lapse
                self._operation_failed("worker_stopped", exc)
        return self.stats

    def _capacity(self) -> tuple[int, int]:
        """Jobs this worker may hold claimed now, and the free room worth a round trip.

        Threads, plus as many jobs ahead as the threads would start within
        PREFETCH_WINDOW at the recent pace; none ahead until a job has finished.
        """
        threads = self.options.concurrency
        most = self.options.most_ahead if self._may_claim_ahead else 0
        pace = self._pace
        if not most or pace is None:
            ahead = 0
        else:
            ahead = min(most, int(threads * PREFETCH_WINDOW / max(pace, 1e-6)))
        capacity = threads + ahead
        refill = self._refill_at = max(1, capacity // 4) if ahead else 1
        return capacity, refill

    def _backend_failed(self, failures: int) -> int:
        """Pause after a failed backend operation (longer each time, at most 5 s).

        A resident worker keeps trying for as long as it runs; a ``once`` worker
        (a cron run) gives up once the backend has kept failing for
        ``WorkerOptions.give_up`` seconds, so the run ends with an error instead
        of hanging until the next one starts.
        """
        failures += 1
        if self.options.once:
            self._check_give_up()
        pause = min(0.05 * 2 ** min(failures, 7), 5.0)
        if self._running or self._unsettled:
            pause = min(pause, max(0.0, self._next_beat - _clock.monotonic()))  # never skip a heartbeat
        self._waker.wait(pause)
        return failures

    def _check_give_up(self) -> None:
        """End a ``once`` run whose backend has kept failing for ``give_up`` seconds."""
        since = self._failing_since
        if since is None:
            return
        failing = _clock.monotonic() - since
        if failing >= self.options.give_up:
            raise QueueUnavailableError(
                f"connection {self.connection_name!r} kept failing for {failing:.1f}s; giving up this --once run "
                f"(last error: {self._last_error})"
            )

    def _heard_discard(self, sender: Any, **kwargs: Any) -> None:
        """Count the unreadable jobs the driver moved aside while this worker's loop claimed."""
        if threading.get_ident() == self._loop_thread:
            self.stats.discarded += 1

    def _grace_over(self) -> bool:
        return self._stopped_at is not None and _clock.monotonic() - self._stopped_at >= self.options.grace

    def _hand_out(self, pool: Pool[QueuedJob], jobs: list[QueuedJob]) -> None:
        running = self._running
        for job in jobs:
            running[id(job)] = job
        self._taken += len(jobs)
        rank = self._rank
        pool.submit(jobs, key=lambda job: (rank.get(job.queue, 0), job.priority))

    def _collect(self, now: float) -> None:
        """Move what the pool threads finished to the owning loop's own list."""
        done = self._done
        if done:
            if not self._unsettled:
                self._unsettled_since = now
            while done:
                self._unsettled.append(done.popleft())

    def _settle(self) -> bool:
        """Apply every finished attempt to the backend; False when the backend failed."""
        self._collect(_clock.monotonic())
        if not self._unsettled:
            return True
        acks = self._apply_others()
        return acks is not None and self._acknowledge(acks)

    def _settle_and_claim(self, limit: int) -> list[QueuedJob] | None:
        """Acknowledge what finished and claim up to ``limit`` jobs, in one round
        trip where the driver allows; None when the backend failed."""
        acks = self._apply_others()
        if acks is None:
            return None
        if self._stop.is_set():  # a job just settled stopped the worker (it raised SystemExit)
            limit = 0
        driver = self.driver
        queues = self.options.queues
        if acks and self._combined and limit > 0:
            try:
                jobs: list[QueuedJob] = driver.acknowledge_and_reserve([c.job for c in acks], queues, limit)
            except Exception as exc:  # noqa: BLE001 - acknowledged again next time: harmless
                self._operation_failed("settle", exc)
                self._unsettled = acks + self._unsettled
                return None
            self._announce(acks)
            return jobs
        if not self._acknowledge(acks):
            return None
        if limit <= 0:
            return []
        found: list[QueuedJob] | None = self._backend("reserve", driver.reserve_many, queues, limit)
        return found

    def _acknowledge(self, acks: list[Completion]) -> bool:
        """Acknowledge the successful attempts in one call; False (and kept to send
        again) when the backend failed."""
        if not acks:
            return True
        try:
            self.driver.acknowledge_many([c.job for c in acks])
        except Exception as exc:  # noqa: BLE001 - kept and retried; the reservation protects the job
            self._operation_failed("settle", exc)
            self._unsettled = acks + self._unsettled
            return False
        self._announce(acks)
        return True

    def _apply_others(self) -> list[Completion] | None:
        """Release or fail the attempts that did not succeed, one call each; returns
        the successful ones, left to acknowledge in a batch (None when the backend failed)."""
        batch, self._unsettled = self._unsettled, []
        acks = [c for c in batch if c.outcome == PROCESSED]
        if len(acks) == len(batch):
            return acks
        applied: list[Completion] = []
        try:
            for completion in batch:
                if completion.outcome != PROCESSED:
                    self.executor.apply(self.driver, completion)
                    applied.append(completion)
        except Exception as exc:  # noqa: BLE001 - kept and retried; the reservation protects the job
            self._operation_failed("settle", exc)
            # Not transactional: retry only what was not performed (a second fail()
            # would store the job twice, a second signal would count it twice).
            performed = {id(c) for c in applied}
            self._unsettled = [c for c in batch if id(c) not in performed]
            self._account(applied)
            return None
        self._account(applied)
        return acks

    def _announce(self, acks: list[Completion]) -> None:
        announce = self.executor.announce
        for completion in acks:
            announce(completion)
        self._account(acks)

    def _account(self, completions: Sequence[Completion]) -> None:
        """Count settled completions, and stop when a job raised SystemExit or KeyboardInterrupt."""
        running = self._running
        stats = self.stats
        pace = self._pace
        for completion in completions:
            running.pop(id(completion.job), None)
            outcome = completion.outcome
            if outcome != ABANDONED and outcome != INTERRUPTED:
                # Quick to rise, slow to fall: one slow job shrinks the prefetch at once.
                duration = completion.duration
                if pace is None:
                    pace = duration
                else:
                    pace += (0.5 if duration > pace else 0.05) * (duration - pace)
            if outcome == PROCESSED:
                stats.processed += 1
            elif outcome == RELEASED:
                stats.released += 1
            elif outcome == FAILED:
                stats.failed += 1
            elif outcome == INTERRUPTED:
                stats.interrupted += 1
            if completion.interrupted and not self._stop.is_set():
                log.warning("a job raised %s: stopping the worker", type(completion.exception).__name__)
                self.stop()
        self._pace = pace

    def _gather_unstarted(self, pool: Pool[QueuedJob]) -> None:
        """Take the jobs waiting in the pool's line, and those a thread declined, to hand back."""
        self._unstarted.extend(pool.hold())
        while self._declined:
            self._unstarted.append(self._declined.popleft())

    def _give_back(self) -> bool:
        """Hand back the claimed jobs that never started (at stop); False when the backend failed."""
        if not self._unstarted:
            return True
        jobs = self._unstarted
        try:
            self.driver.give_back(jobs)
        except Exception as exc:  # noqa: BLE001 - retried; at worst their reservations lapse
            self._operation_failed("give_back", exc)
            return False
        self._unstarted = []
        for job in jobs:
            self._running.pop(id(job), None)
        return True

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
        """The grace is over: hand back the attempts still running in threads, without
        spending a try (their threads cannot be stopped; the process is on its way out)."""
        self._collect(_clock.monotonic())
        finished = {id(c.job) for c in self._unsettled}
        cut_short = [job for key, job in self._running.items() if key not in finished]
        if cut_short:
            completions = [Completion(job, INTERRUPTED, interrupted=True) for job in cut_short]
            try:
                self.driver.give_back(cut_short)
            except Exception as exc:  # noqa: BLE001 - their reservations lapse and they run again
                self._operation_failed("give_back", exc)
                log.warning(
                    "grace period over: %d running job(s) could not be handed back; they run again once "
                    "their reservations lapse",
                    len(cut_short),
                )
            else:
                self._announce(completions)
        left = len(self._unsettled)
        if left:
            log.warning(
                "grace period over: %d finished job(s) could not be settled; their reservations will lapse "
                "and another worker will run them again",
                left,
            )
        self._running.clear()
        self._unstarted = []

    def _backend(self, operation: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported, retried by the loop with a backoff
            self._operation_failed(operation, exc)
            return None

    def _operation_failed(self, operation: str, exc: BaseException) -> None:
        info = ExceptionInfo.from_exception(exc)
        self._last_error = f"{operation}: {info.error}"
        if self._failing_since is None:
            self._failing_since = _clock.monotonic()
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
    def _start_pool(self) -> Pool[QueuedJob]:
        self._children_interrupted_at = None
        if self.options.timeout is not None or any(c.TIMEOUT is not None for c in self.registry.classes()):
            # Fork the fork server now, from this thread, while no pool thread is running.
            self._get_supervisor()
        pool = self._pool = Pool(self.options.concurrency, self._run_claimed)
        if self._stop.is_set() or self._signalled is not None:
            pool.pause()
        return pool

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        with self._supervisor_lock:
            supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.close()
        if pool is not None:
            pool.close(timeout=1.0)

    def _run_claimed(self, job: QueuedJob) -> None:
        """A pool thread's work: run one attempt, report it, and wake the owning
        loop when there is something for it to do."""
        pool = self._pool
        if pool is None or pool.paused:
            # Taken in the instant stop() paused the pool: it goes back unstarted.
            self._declined.append(job)
            self._waker.set()
            return
        try:
            completion = self.run_attempt(job, self._stop_notice)
        except BaseException as exc:  # noqa: BLE001 - never lose a completion
            completion = Completion(job, ABANDONED, exception=exc, interrupted=True)
        done = self._done
        done.append(completion)
        # A batch's worth finished, or nothing left to start: the loop has work. (It
        # also looks every ACK_DELAY while jobs wait in the line, so no wake-up is lost.)
        if len(done) >= self._refill_at or not pool.waiting():
            self._waker.set()

    def attempt_timeout(self, job: QueuedJob) -> float | None:
        """The time limit of this attempt: its job's ``TIMEOUT``, else the worker's."""
        job_class = self.registry._jobs.get(job.name)
        limit = getattr(job_class, "TIMEOUT", None) if job_class is not None else None
        return limit if limit is not None else self.options.timeout

    def run_attempt(self, job: QueuedJob, stop_requested: threading.Event) -> Completion:
        """Run one attempt: in this thread, or in a supervised child when it has a time limit."""
        lost = self.executor.lost(job)
        if lost is not None:
            return lost
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
