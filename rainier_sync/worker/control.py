"""Starting, stopping and signals: the worker's controls, for any thread."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import _clock
from .._text import escaped

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..outbox.relay import Relay
    from .health import Health
    from .options import WorkerOptions, WorkerStats
    from .pool import Pool

log = logging.getLogger("rainier_sync")


class Control:
    """:meth:`stop`, :meth:`start`, :meth:`join` and the signal handlers of a
    :class:`~rainier_sync.Worker`; the owning loop carries a stop out."""

    manager: QueueManager
    options: WorkerOptions
    stats: WorkerStats
    _health: Health
    #: The outbox relay running beside the loop (``WorkerOptions.relay``), or None.
    _relay: Relay | None = None
    connection_name: str | None
    _stop: threading.Event
    _stop_notice: threading.Event
    _stopped_at: float | None
    _pool: Pool[Any] | None
    _waker: Any
    _signalled: tuple[float | None] | None
    _thread: threading.Thread | None

    def run(self) -> WorkerStats:
        raise NotImplementedError

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
        if self._relay is not None:
            self._relay.stop()
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
        if self._relay is not None:
            self._relay.stop()  # a flag and the relay's waker: as safe here as ours
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

    # -- the outbox relay ------------------------------------------------------------
    def _make_relay(self) -> Relay | None:
        """The relay ``WorkerOptions(relay=True)`` asks for; a manager without an outbox is refused now."""
        if not self.options.relay:
            return None
        from ..outbox.relay import Relay

        return Relay(self.manager, sleep=self.options.sleep)

    def _start_relay(self) -> None:
        """At the start of a run: the relay's thread, or (``once``) one relaying of what is committed."""
        relay = self._relay
        if relay is None:
            return
        if self.options.once:
            try:
                relay.run_once()
            except Exception as exc:  # noqa: BLE001 - the relay reported it (queue_operation_failed); the run goes on
                log.error(
                    "the outbox relay (%s) did not relay everything before this run's first claim: %s",
                    relay.outbox.describe(),
                    escaped(exc),
                )
        else:
            relay.start()

    def _stop_relay(self) -> None:
        """At the end of a run: the relay finishes the batch it is publishing."""
        relay = self._relay
        if relay is None or self.options.once:
            return
        relay.stop()
        wait = max(self.options.grace, 5.0)
        if not relay.join(wait):
            log.warning(
                "the outbox relay did not stop within %.0fs; a batch it had not deleted is published again by the "
                "next relay",
                wait,
            )

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
