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

import logging
import math
import threading
from typing import TYPE_CHECKING, Any

from .. import _clock, signals
from ..errors import ConfigurationError
from ..execution import Executor
from ..fleet import RECORD_EVERY, FleetRecorder
from ..scheduler import Scheduler
from ..state.base import STORE_HINT
from ..types import QueuedJob
from .attempts import Attempts
from .control import Control, finish_relay, make_relay, start_relay
from .health import TOUCH_EVERY, Health, Turns, WorkerHealth, is_outage
from .options import ACK_DELAY, PREFETCH_WINDOW, WorkerOptions, WorkerStats
from .pool import Line
from .settle import Claims
from .stopping import Stopping

if TYPE_CHECKING:
    from ..container import Container
    from ..drivers.base import BaseQueue, ConsumerSession, Waker
    from ..manager import QueueManager
    from ..outbox.relay import Relay
    from ..registry import JobRegistry
    from ..state.base import LockStore

__all__ = ["Worker"]

log = logging.getLogger("rainier_sync")


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
        from ..drivers.base import Waker

        self.manager = manager
        self.options = options = options or WorkerOptions()
        self.registry = registry if registry is not None else manager.registry
        self.container = container if container is not None else manager.container
        self.connection_name = name = connection or options.connection or manager.default
        #: The connection's queue (its driver's instance) this worker claims from.
        self.queue: BaseQueue = manager.connection(name)
        _check(self.queue, name, self.registry, manager.locks)
        self.executor = _executor(self, self.queue)
        #: Dispatches the manager's periodic jobs as they fall due (``WorkerOptions.schedule``).
        self.scheduler = Scheduler(manager, name) if options.schedule else None
        self.stats = WorkerStats()
        waker, requested, notice = Waker(), threading.Event(), threading.Event()
        self._health = health = Health(self, name, once=options.once, give_up=options.give_up)
        #: Runs attempts, in this process or (with a time limit) in supervised children.
        self.attempts = Attempts(self.executor, manager, self.registry, options, recorded=manager.locks is not None)
        self._turns = turns = Turns(options.health_file)
        #: This worker's record in the lock store, and its counts per minute (None without a store).
        self.fleet = None if manager.locks is None else FleetRecorder(
            manager.locks, name or self.queue.connection, options.queues, options.concurrency,
            report=health.failed, running=self.attempts.running_since, last_turn=lambda: turns.last,
        )  # fmt: skip
        self._session = Session(self.queue, health)
        self._claims = Claims(
            self._session, self.executor, self.stats, report=health.failed, stop=self.stop,
            stopping=requested.is_set, count=self.fleet.count if self.fleet is not None else None,
        )  # fmt: skip
        self._line = Line(options.concurrency, self.attempts, self._claims, waker, notice, options.queues)
        self._relay = make_relay(manager, options)
        self._control = Control(options, waker, self._line, self._relay, requested, notice)
        self._claimable = Claimable(manager.locks, name, options, health)
        self._loop = Loop(
            options, self.queue, name, stats=self.stats, scheduler=self.scheduler, fleet=self.fleet,
            relay=self._relay, health=health, turns=turns, session=self._session, claims=self._claims,
            line=self._line, control=self._control, claimable=self._claimable, waker=waker, notice=notice,
            stopping=Stopping(
                self._control, self.attempts, self._claims, self._line, self._session, health, waker
            ),
        )  # fmt: skip
        self._thread: threading.Thread | None = None

    def health(self) -> WorkerHealth:
        """What a liveness probe judges: how long ago the loop last turned, what it
        holds and runs, and how the backend has been answering. Safe from any thread."""
        last, failing = self._turns.last, self._health.failing_since
        monotonic = _clock.monotonic()
        return WorkerHealth(
            last_turn_age=None if last is None else max(0.0, monotonic - last),
            running=self._line.busy,
            held=len(self._claims.running),
            stopping=self.stopping,
            last_error=self._health.last_error,
            failing_since=None if failing is None else _clock.now() - (monotonic - failing),
        )

    def run(self) -> WorkerStats:
        """Work until stopped; with ``once``, until nothing is due. Returns the stats.

        It first waits for a backend that cannot be reached yet, as for an outage
        (a ``once`` run gives up after ``give_up`` seconds); a backend that answers
        and refuses raises :class:`~rainier_sync.errors.ConfigurationError` at once.
        """
        self._loop.run()
        return self.stats

    @property
    def stopping(self) -> bool:
        return self._control.requested.is_set()

    def stop(self, grace: float | None = None) -> None:
        """Take no new job; let running ones finish (up to the grace period).
        Jobs claimed ahead and not started go back to the queue."""
        self._control.stop(grace)

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
        self._control.install_signal_handlers()


def _check(queue: BaseQueue, name: str | None, registry: JobRegistry, locks: LockStore | None) -> None:
    """Refuse a connection that reserves without renewing, and jobs needing a store the manager lacks."""
    if queue.reservation is not None and not queue.capabilities.renews:
        raise ConfigurationError(
            f"connection {name!r} ({queue.describe()}) reserves jobs but cannot renew "
            "reservations: a job running longer than its reservation would be handed to a second worker"
        )
    if locks is None:
        needing = registry.needing_a_store()
        if needing:
            names = ", ".join(sorted(cls.NAME for cls in needing))
            raise ConfigurationError(
                f"jobs {names} keep state in a lock store (middleware, KEEP_RESULT), and the manager has none: "
                + STORE_HINT
            )


def _executor(worker: Worker, queue: BaseQueue) -> Executor:
    manager = worker.manager
    executor = Executor(worker.registry, worker.container, locks=manager.locks, sender=worker, dispatcher=manager)
    executor.in_rounds = True  # the owning loop counts jobs of batches a round at a time (settle.py)
    executor.hands_over = queue if queue.capabilities.hands_over else None
    return executor


class Session:
    """A worker's consumer session on its queue, opened on first use."""

    def __init__(self, queue: BaseQueue, health: Health) -> None:
        self._queue = queue
        self._health = health
        self._session: ConsumerSession | None = None

    def __call__(self) -> ConsumerSession:
        session = self._session
        if session is None:
            session = self._session = self._queue.open_session()
        return session

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - what the session held comes back when its reservations lapse
                self._health.failed("close_session", exc)


class Claimable:
    """A worker's queues less the paused ones (looked up at most every ``sleep`` seconds)."""

    def __init__(self, locks: LockStore | None, connection: str | None, options: WorkerOptions, health: Health) -> None:
        self._locks = locks
        self._flag = f"paused:{connection}"
        self._every = min(options.sleep, 5.0)
        self._health = health
        self._queues = list(options.queues)
        #: The paused queues of this connection as last looked up, and when.
        self.paused: set[str] | None = None
        self._checked = 0.0

    def queues(self, now: float) -> list[str]:
        locks = self._locks
        if locks is None:
            return self._queues
        if now >= self._checked + self._every or self.paused is None:
            self._checked = now
            try:
                self.paused = locks.flags(self._flag)
            except Exception as exc:  # noqa: BLE001 - reported; the last answer stands meanwhile
                self._health.failed("paused", exc)
                if self.paused is None:
                    self.paused = set()
        paused = self.paused
        return [q for q in self._queues if q not in paused] if paused else self._queues


class Loop:
    """The owning loop of one worker: the one thread that talks to the backend."""

    def __init__(
        self,
        options: WorkerOptions,
        queue: BaseQueue,
        connection_name: str | None,
        *,
        stats: WorkerStats,
        scheduler: Scheduler | None,
        fleet: FleetRecorder | None,
        relay: Relay | None,
        health: Health,
        turns: Turns,
        session: Session,
        claims: Claims,
        line: Line,
        control: Control,
        claimable: Claimable,
        stopping: Stopping,
        waker: Waker,
        notice: threading.Event,
    ) -> None:
        self._options = options
        self._queue = queue
        self._connection_name = connection_name
        self._stats = stats
        self._scheduler = scheduler
        self._fleet = fleet
        self._relay = relay
        self._health = health
        self._turns = turns
        self._session = session
        self._claims = claims
        self._line = line
        self._control = control
        self._claimable = claimable
        self._stopping = stopping
        self._waker = waker
        self._notice = notice
        capabilities = self._queue.capabilities
        self._combined = capabilities.combined_claim
        # Claiming ahead needs a driver that hands unstarted jobs back uncounted at stop.
        self._may_claim_ahead = capabilities.give_back
        reservation = self._queue.reservation
        self._beat = options.heartbeat or (reservation / 3 if reservation else None)
        self._next_beat = float("inf")
        self._next_reclaim = 0.0
        self._taken = 0
        #: The longest the loop waits between turns: with a health file, it turns
        #: about as often as it touches the file, busy or idle, whatever ``sleep``;
        #: with a record in the fleet, as often as the record is refreshed.
        self._longest_wait = TOUCH_EVERY if self._turns.file is not None else float("inf")
        if self._fleet is not None:
            self._longest_wait = min(self._longest_wait, RECORD_EVERY)
        #: The owning loop's thread: discards it hears of while claiming are this worker's.
        self._thread: int | None = None
        self._eviction_checked = False

    # -- the owning loop -----------------------------------------------------------
    def run(self) -> None:
        """Start up, turn until the run is over, shut down."""
        self._begin()
        try:
            if self._start_up():
                # Recorded once its backend answers: a worker still waiting for it is not
                # listed as working, and its record's failures do not hide why it waits.
                if self._fleet is not None:  # its thread starts after attempts.prepare() forked
                    self._fleet.start()
                start_relay(self._relay, self._options)
                while self._turn():
                    pass
        finally:
            self._shut_down()

    def _begin(self) -> None:
        now = _clock.monotonic()
        self._next_beat = now + self._beat if self._beat else float("inf")
        self._next_reclaim = 0.0
        self._health.begin()
        self._thread = threading.get_ident()
        signals.queue_message_discarded.connect(self._heard_discard, sender=self._queue, weak=False)
        control = self._control
        self._line.start(lambda: control.requested.is_set() or control.signalled is not None)

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
            self._control.carry_out_signal()
            if self._control.requested.is_set():
                return False
            self._turns.turn(_clock.monotonic())
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
                    self._connection_name, _clock.monotonic() - health.failing_since,
                )  # fmt: skip
            health.clear()
            self._next_reclaim = _clock.monotonic() + self._options.reclaim_interval
            return True

    def _reach(self) -> None:
        """The start-up's try: sweep for lapsed reservations (the loop's first backend
        operation), then, where the driver can tell, warn of a backend that may evict jobs."""
        self._session().reclaim_expired()
        if self._queue.capabilities.eviction_check and not self._eviction_checked:
            self._queue.check_eviction_policy()
            self._eviction_checked = True

    def _turn(self) -> bool:
        """One turn of the loop; False when the run is over."""
        self._waker.clear()
        if self._options.once:
            self._health.check_give_up()
        self._control.carry_out_signal()
        now = _clock.monotonic()
        self._turns.turn(now)
        self._maintain(now)
        if self._control.requested.is_set():
            return self._stopping.turn(self.backend_failed)
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
            self._next_reclaim = now + self._options.reclaim_interval
            self._health.call("reclaim_expired", self._session().reclaim_expired)
        scheduler = self._scheduler
        if scheduler is not None and not self._control.requested.is_set() and _clock.now() >= scheduler.next_due:
            self._health.call("schedule", scheduler.run_due)
        claims.collect(now)

    def _claim(self, now: float) -> bool:
        """Settle and claim for the room there is, or wait for room; False when a run is done."""
        opts, claims = self._options, self._claims
        capacity, refill = self._capacity()
        waiting = self._line.waiting()
        limit = capacity - len(claims.running) + len(claims.unsettled)
        if opts.max_jobs is not None:
            limit = min(limit, opts.max_jobs - self._taken)
            if limit <= 0 and not claims.held:
                return False
        if limit <= 0 or (limit < refill and waiting):
            self._settle_or_wait(now, waiting, refill)
            return True
        queues = self._claimable.queues(now)
        if not queues:  # every queue is paused
            if opts.once and not claims.held and not claims.done:
                return False
            self._settle_or_idle(now)
            return True
        discarded = self._stats.discarded
        jobs = claims.settle_and_claim(queues, limit, combined=self._combined)
        if jobs is None:
            self.backend_failed()
            return True
        self._health.ok()
        if jobs:
            self._hand_out(jobs)
            return True
        if self._stats.discarded > discarded:
            return True  # the claim met only unreadable jobs: jobs due behind them may be waiting
        if opts.once and not claims.running and not claims.done:
            return False
        self._idle(now)
        return True

    def _settle_or_idle(self, now: float) -> None:
        """Every queue is paused: settle what finished, then wait a ``sleep``."""
        if self._claims.unsettled and not self._claims.settle(now):
            self.backend_failed()
            return
        if not self._claims.held:
            self._stats.idles += 1
        self._waker.wait(min(self._options.sleep, self._longest_wait))

    def _settle_or_wait(self, now: float, waiting: int, refill: int) -> None:
        """Nothing worth a round trip yet: settle only what should not wait longer, or wait."""
        claims = self._claims
        unsettled = claims.unsettled
        if unsettled and (not waiting or len(unsettled) >= refill or now - claims.unsettled_since >= ACK_DELAY):
            if not claims.settle(now):
                self.backend_failed()
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
        if self._line.waiting():
            self._waker.wait(ACK_DELAY)  # the line is still running down
            return
        claims = self._claims
        if not claims.running:
            self._stats.idles += 1
        sleep = min(self._options.sleep, self._longest_wait)
        wait = sleep if self._beat is None or not claims.held else min(sleep, max(0.0, self._next_beat - now))
        if self._scheduler is not None:
            wait = min(wait, max(0.0, self._scheduler.next_due - _clock.now()))  # wake for the next tick
        try:
            self._session().wait_for_jobs(self._options.queues, wait, self._waker)
        except Exception as exc:  # noqa: BLE001 - reported; then sleep as if nothing had come
            self._health.failed("wait_for_jobs", exc)
            self._waker.wait(wait)

    def _shut_down(self) -> None:
        """The run is over: hand back what never started, stop the pool, close the session."""
        signals.queue_message_discarded.disconnect(self._heard_discard)
        self._notice.set()
        stopping = self._stopping
        if self._line.started:
            stopping.gather_unstarted()
        if stopping.unstarted and not stopping.give_back():
            log.warning(
                "%d job(s) claimed ahead could not be handed back; they run again once their reservations lapse",
                len(stopping.unstarted),
            )
        self._line.close()
        self._session.close()
        if self._fleet is not None:
            self._fleet.leave()
        finish_relay(self._relay, self._options)

    # -- the pieces of a turn ------------------------------------------------------------
    def _capacity(self) -> tuple[int, int]:
        """Jobs this worker may hold claimed now, and the free room worth a round trip.

        Threads, plus as many jobs ahead as the threads would start within
        PREFETCH_WINDOW at the recent pace; none ahead until a job has finished.
        """
        threads = self._options.concurrency
        most = self._options.most_ahead if self._may_claim_ahead else 0
        pace = self._claims.pace
        if not most or pace is None:
            ahead = 0
        else:
            ahead = min(most, int(threads * PREFETCH_WINDOW / max(pace, 1e-6)))
        capacity = threads + ahead
        refill = self._line.refill_at = max(1, capacity // 4) if ahead else 1
        return capacity, refill

    def backend_failed(self) -> None:
        """Pause after a failed backend operation (see :meth:`Health.backoff`)."""
        pause = self._health.backoff()
        if self._claims.held:
            pause = min(pause, max(0.0, self._next_beat - _clock.monotonic()))  # never skip a heartbeat
        self._waker.wait(pause)

    def _heard_discard(self, sender: Any, **kwargs: Any) -> None:
        """Count the unreadable jobs the driver moved aside while this worker's loop claimed."""
        if threading.get_ident() == self._thread:
            self._stats.discarded += 1

    def _hand_out(self, jobs: list[QueuedJob]) -> None:
        self._claims.claimed(jobs)
        self._taken += len(jobs)
        self._line.submit(jobs)

    def _heartbeat(self) -> None:
        jobs = list(self._claims.running.values())
        if jobs:
            self._health.call("extend", self._session().extend, jobs, self._queue.reservation)
