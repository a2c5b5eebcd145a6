"""The worker's owning loop: the one thread that talks to the backend.

A run **starts up** first: it waits for the backend to answer (its first
sweep for lapsed reservations), riding out an outage as it would one later
on, while a backend that answers and refuses the configuration ends the run
at once. Then each turn of :meth:`Worker.run` goes through named phases: **maintain**
(renew the reservations of held jobs, sweep lapsed ones, collect finished
attempts), then either **shut down** (once stopped: hand back what never
started, settle, wait out the grace) or **claim** (settle and claim in one
round trip where the driver can) and, with nothing to claim, **idle** on a
:class:`~rainier_sync.drivers.base.Waker` that the backend, a finishing job
or :meth:`Worker.stop` can set. Pool threads only run handlers, so a driver
needs one connection per worker process, not one per thread.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from typing import TYPE_CHECKING, Any

from .. import _clock, signals
from ..errors import ConfigurationError
from ..execution import ABANDONED, Completion, Executor
from ..fleet import RECORD_EVERY, FleetRecorder, wait_bucket
from ..scheduler import Scheduler
from ..state.base import STORE_HINT
from ..types import QueuedJob
from .attempts import Attempts
from .control import Control
from .health import TOUCH_EVERY, Health, HealthFile, WorkerHealth, is_outage
from .options import ACK_DELAY, PREFETCH_WINDOW, WorkerOptions, WorkerStats
from .pool import Pool
from .settle import Claims
from .stopping import Stopping

if TYPE_CHECKING:
    from ..container import Container
    from ..drivers.base import BaseQueue, ConsumerSession
    from ..manager import QueueManager
    from ..registry import JobRegistry

__all__ = ["Worker"]

log = logging.getLogger("rainier_sync")


class Worker(Control, Stopping):
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
        from ..drivers.base import Waker

        self.manager = manager
        self.options = options or WorkerOptions()
        self.registry = registry if registry is not None else manager.registry
        self.container = container if container is not None else manager.container
        self.connection_name = connection or self.options.connection or manager.default
        self.driver: BaseQueue = manager.connection(self.connection_name)
        capabilities = self.driver.capabilities
        if self.driver.reservation is not None and not capabilities.renews:
            raise ConfigurationError(
                f"connection {self.connection_name!r} ({self.driver.describe()}) reserves jobs but cannot renew "
                "reservations: a job running longer than its reservation would be handed to a second worker"
            )
        if manager.locks is None:
            needing = self.registry.needing_a_store()
            if needing:
                names = ", ".join(sorted(cls.NAME for cls in needing))
                raise ConfigurationError(
                    f"jobs {names} keep state in a lock store (middleware, KEEP_RESULT), and the manager has none: "
                    + STORE_HINT
                )
        self.executor = Executor(self.registry, self.container, locks=manager.locks, sender=self, dispatcher=manager)
        self.executor.in_rounds = True  # the owning loop counts jobs of batches a round at a time (settle.py)
        self.executor.hands_over = self.driver if capabilities.hands_over else None
        #: Dispatches the manager's periodic jobs as they fall due (``WorkerOptions.schedule``).
        self.scheduler = Scheduler(manager, self.connection_name) if self.options.schedule else None
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._stopped_at: float | None = None
        self._waker = Waker()
        self._pool: Pool[QueuedJob] | None = None
        self._session: ConsumerSession | None = None
        self._health = Health(self, self.connection_name, once=self.options.once, give_up=self.options.give_up)
        #: The attempts running in pool threads, and when each started (seconds
        #: since the epoch), kept only for the worker's record.
        self._started: dict[int, tuple[QueuedJob, float]] | None = None
        #: This worker's record in the lock store, and its counts per minute (None without a store).
        self.fleet: FleetRecorder | None = None
        if manager.locks is not None:
            self._started = {}
            self.fleet = FleetRecorder(
                manager.locks, self.connection_name or self.driver.connection, self.options.queues,
                self.options.concurrency,
                report=self._health.failed, running=self._running_since, last_turn=lambda: self._last_turn,
            )  # fmt: skip
        self._claims = Claims(
            self._consumer, self.executor, self.stats, report=self._health.failed, stop=self.stop,
            stopping=self._stop.is_set, count=self.fleet.count if self.fleet is not None else None,
        )  # fmt: skip
        # What running jobs see as context.stop_requested: one notice for all of
        # them (set by stop()), apart from the worker's own stop flag.
        self._stop_notice = threading.Event()
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
        self._rank = {queue: index for index, queue in enumerate(self.options.queues)}
        self._queues = list(self.options.queues)
        #: The paused queues of this connection as last looked up, and when.
        self._paused: set[str] | None = None
        self._paused_checked = 0.0
        self._combined = capabilities.combined_claim
        # Claiming ahead needs a driver that hands unstarted jobs back uncounted at stop.
        self._may_claim_ahead = capabilities.give_back
        #: Runs attempts, in this process or (with a time limit) in supervised children.
        self.attempts = Attempts(self.executor, manager, self.registry, self.options)
        #: The owning loop's thread: discards it hears of while claiming are this worker's.
        self._loop_thread: int | None = None
        reservation = self.driver.reservation
        self._beat = self.options.heartbeat or (reservation / 3 if reservation else None)
        self._next_beat = float("inf")
        self._next_reclaim = 0.0
        self._health_file = HealthFile(self.options.health_file) if self.options.health_file else None
        #: The longest the loop waits between turns: with a health file, it turns
        #: about as often as it touches the file, busy or idle, whatever ``sleep``.
        self._longest_wait = TOUCH_EVERY if self._health_file is not None else float("inf")
        if self.fleet is not None:  # and as often as its record is refreshed, which waits for a turn
            self._longest_wait = min(self._longest_wait, RECORD_EVERY)
        #: When the owning loop last began a turn (monotonic; None before the run).
        self._last_turn: float | None = None
        self._relay = self._make_relay()
        self._eviction_checked = False

    def health(self) -> WorkerHealth:
        """What a liveness probe judges: how long ago the loop last turned, what it
        holds and runs, and how the backend has been answering. Safe from any thread."""
        last, pool, failing = self._last_turn, self._pool, self._health.failing_since
        monotonic = _clock.monotonic()
        return WorkerHealth(
            last_turn_age=None if last is None else max(0.0, monotonic - last),
            running=pool.busy if pool is not None else 0,
            held=len(self._claims.running),
            stopping=self.stopping,
            last_error=self._health.last_error,
            failing_since=None if failing is None else _clock.now() - (monotonic - failing),
        )

    # -- the owning loop -----------------------------------------------------------
    def run(self) -> WorkerStats:
        """Work until stopped; with ``once``, until nothing is due. Returns the stats.

        It first waits for a backend that cannot be reached yet, as for an outage
        (a ``once`` run gives up after ``give_up`` seconds); a backend that answers
        and refuses raises :class:`~rainier_sync.errors.ConfigurationError` at once.
        """
        self._begin()
        try:
            if self._start_up():
                # Recorded once its backend answers: a worker still waiting for it is not
                # listed as working, and its record's failures do not hide why it waits.
                if self.fleet is not None:  # its thread starts after attempts.prepare() forked
                    self.fleet.start()
                self._start_relay()
                while self._turn():
                    pass
        finally:
            self._shut_down()
        return self.stats

    def _begin(self) -> None:
        now = _clock.monotonic()
        self._next_beat = now + self._beat if self._beat else float("inf")
        self._next_reclaim = 0.0
        self._health.begin()
        self._loop_thread = threading.get_ident()
        signals.queue_message_discarded.connect(self._heard_discard, sender=self.driver, weak=False)
        self._start_pool()

    def _start_up(self) -> bool:
        """Wait until the backend answers; False when the worker was stopped first.

        A backend that cannot be reached yet (:func:`~.health.is_outage`) is
        waited for as an outage later on is: each failed try reported (log,
        ``queue_operation_failed``, :meth:`health`), tried again with a backoff,
        and a ``once`` run gives up after ``give_up`` seconds. Any other error (a
        backend that answers and refuses: bad credentials, no such database)
        ends the run at once. The loop counts as turning meanwhile (the health
        file is touched).
        """
        health = self._health
        while True:
            self._waker.clear()
            signalled, self._signalled = self._signalled, None
            if signalled is not None:
                self.stop(signalled[0])
            if self._stop.is_set():
                return False
            now = self._last_turn = _clock.monotonic()
            if self._health_file is not None:
                self._health_file.turn(now)
            try:
                self._reach()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                health.failed("start", exc)
                self._waker.wait(min(health.backoff(), self._longest_wait))
                continue
            if health.failing_since is not None:
                log.info(
                    "connection %r answered after %.1fs; the worker starts",
                    self.connection_name, _clock.monotonic() - health.failing_since,
                )  # fmt: skip
            health.clear()
            self._next_reclaim = _clock.monotonic() + self.options.reclaim_interval
            return True

    def _reach(self) -> None:
        """The start-up's try: sweep for lapsed reservations (the loop's first backend
        operation), then, where the driver can tell, warn of a backend that may evict jobs."""
        self._consumer().reclaim_expired()
        if self.driver.capabilities.eviction_check and not self._eviction_checked:
            self.driver.check_eviction_policy()
            self._eviction_checked = True

    def _turn(self) -> bool:
        """One turn of the loop; False when the run is over."""
        self._waker.clear()
        if self.options.once:
            self._health.check_give_up()
        signalled, self._signalled = self._signalled, None
        if signalled is not None:
            self.stop(signalled[0])
        now = self._last_turn = _clock.monotonic()
        if self._health_file is not None:
            self._health_file.turn(now)
        self._maintain(now)
        if self._stop.is_set():
            return self._stopping()
        return self._claim(now)

    def _maintain(self, now: float) -> None:
        """Renew what this worker holds, sweep lapsed reservations, collect finished attempts.

        Renewals come first, so neither a sweep nor a backend that keeps failing
        to settle can let them lapse under jobs this worker is still running.
        """
        claims = self._claims
        if self._beat is not None and now >= self._next_beat:
            self._next_beat = now + self._beat
            if claims.held:
                self._heartbeat()
        if now >= self._next_reclaim:
            self._next_reclaim = now + self.options.reclaim_interval
            self._health.call("reclaim_expired", self._consumer().reclaim_expired)
        scheduler = self.scheduler
        if scheduler is not None and not self._stop.is_set() and _clock.now() >= scheduler.next_due:
            self._health.call("schedule", scheduler.run_due)
        claims.collect(now)

    def _claim(self, now: float) -> bool:
        """Settle and claim for the room there is, or wait for room; False when a run is done."""
        opts, claims, pool = self.options, self._claims, self._line()
        capacity, refill = self._capacity()
        waiting = pool.waiting()
        limit = capacity - len(claims.running) + len(claims.unsettled)
        if opts.max_jobs is not None:
            limit = min(limit, opts.max_jobs - self._taken)
            if limit <= 0 and not claims.held:
                return False
        if limit <= 0 or (limit < refill and waiting):
            self._settle_or_wait(now, waiting, refill)
            return True
        queues = self._claimable(now)
        if not queues:  # every queue is paused
            if opts.once and not claims.held and not claims.done:
                return False
            self._settle_or_idle(now)
            return True
        discarded = self.stats.discarded
        jobs = claims.settle_and_claim(queues, limit, combined=self._combined)
        if jobs is None:
            self._backend_failed()
            return True
        self._health.ok()
        if jobs:
            self._hand_out(jobs)
            return True
        if self.stats.discarded > discarded:
            return True  # the claim met only unreadable jobs: jobs due behind them may be waiting
        if opts.once and not claims.running and not claims.done:
            return False
        self._idle(now)
        return True

    def _claimable(self, now: float) -> list[str]:
        """This worker's queues less the paused ones (looked up at most every ``sleep`` seconds)."""
        locks = self.manager.locks
        if locks is None:
            return self._queues
        if now >= self._paused_checked + min(self.options.sleep, 5.0) or self._paused is None:
            self._paused_checked = now
            try:
                self._paused = locks.flags(f"paused:{self.connection_name}")
            except Exception as exc:  # noqa: BLE001 - reported; the last answer stands meanwhile
                self._health.failed("paused", exc)
                if self._paused is None:
                    self._paused = set()
        paused = self._paused
        return [q for q in self._queues if q not in paused] if paused else self._queues

    def _settle_or_idle(self, now: float) -> None:
        """Every queue is paused: settle what finished, then wait a ``sleep``."""
        if self._claims.unsettled and not self._claims.settle(now):
            self._backend_failed()
            return
        if not self._claims.held:
            self.stats.idles += 1
        self._waker.wait(min(self.options.sleep, self._longest_wait))

    def _settle_or_wait(self, now: float, waiting: int, refill: int) -> None:
        """Nothing worth a round trip yet: settle only what should not wait longer, or wait."""
        claims = self._claims
        unsettled = claims.unsettled
        if unsettled and (not waiting or len(unsettled) >= refill or now - claims.unsettled_since >= ACK_DELAY):
            if not claims.settle(now):
                self._backend_failed()
            return
        # Pool threads wake this loop when the line runs dry or a batch's
        # worth has finished; in between it looks again every ACK_DELAY.
        timeout = None if self._beat is None else max(0.0, self._next_beat - now)
        if unsettled:
            timeout = max(0.0, claims.unsettled_since + ACK_DELAY - now)
        elif waiting:
            timeout = ACK_DELAY if timeout is None else min(timeout, ACK_DELAY)
        if math.isfinite(self._longest_wait):
            timeout = self._longest_wait if timeout is None else min(timeout, self._longest_wait)
        self._waker.wait(timeout)

    def _idle(self, now: float) -> None:
        """The backend has nothing to claim: wait for it (or for the line to run down)."""
        if self._line().waiting():
            self._waker.wait(ACK_DELAY)  # the line is still running down
            return
        claims = self._claims
        if not claims.running:
            self.stats.idles += 1
        sleep = min(self.options.sleep, self._longest_wait)
        wait = sleep if self._beat is None or not claims.held else min(sleep, max(0.0, self._next_beat - now))
        if self.scheduler is not None:
            wait = min(wait, max(0.0, self.scheduler.next_due - _clock.now()))  # wake for the next tick
        try:
            self._consumer().wait_for_jobs(self.options.queues, wait, self._waker)
        except Exception as exc:  # noqa: BLE001 - reported; then sleep as if nothing had come
            self._health.failed("wait_for_jobs", exc)
            self._waker.wait(wait)

    def _shut_down(self) -> None:
        """The run is over: hand back what never started, stop the pool, close the session."""
        signals.queue_message_discarded.disconnect(self._heard_discard)
        self._stop_notice.set()
        if self._pool is not None:
            self._gather_unstarted()
        if self._unstarted and not self._give_back():
            log.warning(
                "%d job(s) claimed ahead could not be handed back; they run again once their reservations lapse",
                len(self._unstarted),
            )
        self._stop_pool()
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - what the session held comes back when its reservations lapse
                self._health.failed("close_session", exc)
        if self.fleet is not None:
            self.fleet.leave()
        self._stop_relay()

    # -- the pieces of a turn ------------------------------------------------------------
    def _consumer(self) -> ConsumerSession:
        """This worker's consumer session, opened on first use."""
        session = self._session
        if session is None:
            session = self._session = self.driver.open_session()
        return session

    def _line(self) -> Pool[QueuedJob]:
        pool = self._pool
        assert pool is not None, "the pool runs while the loop does"
        return pool

    def _capacity(self) -> tuple[int, int]:
        """Jobs this worker may hold claimed now, and the free room worth a round trip.

        Threads, plus as many jobs ahead as the threads would start within
        PREFETCH_WINDOW at the recent pace; none ahead until a job has finished.
        """
        threads = self.options.concurrency
        most = self.options.most_ahead if self._may_claim_ahead else 0
        pace = self._claims.pace
        if not most or pace is None:
            ahead = 0
        else:
            ahead = min(most, int(threads * PREFETCH_WINDOW / max(pace, 1e-6)))
        capacity = threads + ahead
        refill = self._refill_at = max(1, capacity // 4) if ahead else 1
        return capacity, refill

    def _backend_failed(self) -> None:
        """Pause after a failed backend operation (see :meth:`Health.backoff`)."""
        pause = self._health.backoff()
        if self._claims.held:
            pause = min(pause, max(0.0, self._next_beat - _clock.monotonic()))  # never skip a heartbeat
        self._waker.wait(pause)

    def _heard_discard(self, sender: Any, **kwargs: Any) -> None:
        """Count the unreadable jobs the driver moved aside while this worker's loop claimed."""
        if threading.get_ident() == self._loop_thread:
            self.stats.discarded += 1

    def _hand_out(self, jobs: list[QueuedJob]) -> None:
        self._claims.claimed(jobs)
        self._taken += len(jobs)
        rank = self._rank
        self._line().submit(jobs, key=lambda job: (rank.get(job.queue, 0), job.priority))

    def _running_since(self) -> list[tuple[QueuedJob, float]]:
        """The attempts running now, and when each started (seconds since the epoch)."""
        started = self._started
        return list(started.values()) if started else []

    def _heartbeat(self) -> None:
        jobs = list(self._claims.running.values())
        if jobs:
            self._health.call("extend", self._consumer().extend, jobs, self.driver.reservation)

    # -- the pool ----------------------------------------------------------------------
    def _start_pool(self) -> Pool[QueuedJob]:
        # Fork the fork server now, from this thread, while no pool thread is running.
        self.attempts.prepare()
        pool = self._pool = Pool(self.options.concurrency, self._run_claimed)
        if self._stop.is_set() or self._signalled is not None:
            pool.pause()
        return pool

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        self.attempts.close()
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
        started = self._started
        if started is not None:
            began = _clock.now()
            started[id(job)] = (job, began)
        try:
            completion = self.attempts.run(job, self._stop_notice)
        except BaseException as exc:  # noqa: BLE001 - never lose a completion
            completion = Completion(job, ABANDONED, exception=exc, interrupted=True)
        if started is not None:
            started.pop(id(job), None)
            completion.wait_bucket = wait_bucket(job, began)
        done = self._claims.done
        done.append(completion)
        # A batch's worth finished, or nothing left to start: the loop has work. (It
        # also looks every ACK_DELAY while jobs wait in the line, so no wake-up is lost.)
        if len(done) >= self._refill_at or not pool.waiting():
            self._waker.set()
