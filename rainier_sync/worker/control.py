"""Stopping a worker from any thread or a signal handler, and the outbox relay
that runs beside its loop."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

from .. import _clock
from .._text import escaped

if TYPE_CHECKING:
    from ..drivers.base import Waker
    from ..manager import QueueManager
    from ..outbox.relay import Relay
    from .options import WorkerOptions
    from .pool import Line

__all__ = ["Control", "make_relay", "start_relay", "finish_relay"]

log = logging.getLogger("rainier_sync")


class Control:
    """A worker's stop: asked for by any thread (:meth:`stop`) or a signal handler
    (:meth:`stop_from_signal`), carried out by the owning loop."""

    def __init__(
        self,
        options: WorkerOptions,
        waker: Waker,
        line: Line,
        relay: Relay | None,
        requested: threading.Event,
        notice: threading.Event,
    ) -> None:
        self._options = options
        self._waker = waker
        self._line = line
        self._relay = relay
        #: Set by :meth:`stop`: the loop takes no new job.
        self.requested = requested
        #: What running jobs see as context.stop_requested: one notice for all of them.
        self._notice = notice
        #: When the stop was asked for (monotonic), for the grace period.
        self.stopped_at: float | None = None
        #: A stop asked for by a signal handler (its grace), for the owning loop to carry out.
        self.signalled: tuple[float | None] | None = None

    def stop(self, grace: float | None = None) -> None:
        """Take no new job; let running ones finish (up to the grace period)."""
        if grace is not None:
            self._options.grace = grace
        if not self.requested.is_set():
            self.stopped_at = _clock.monotonic()
            self.requested.set()
        self._line.pause()
        if self._relay is not None:
            self._relay.stop()
        self._notice.set()
        self._waker.set()

    def stop_from_signal(self, grace: float | None) -> None:
        """:meth:`stop` for a signal handler, taking no lock a handler could find
        held by the very thread it interrupted (an Event's, the pool's): the
        owning loop carries the stop out as soon as it wakes."""
        self.signalled = (grace,)
        self._line.pause()
        if self._relay is not None:
            self._relay.stop()  # a flag and the relay's waker: as safe here as ours
        self._waker.set()  # re-entrant

    def carry_out_signal(self) -> None:
        """The owning loop's part: carry out a stop a signal handler asked for."""
        signalled, self.signalled = self.signalled, None
        if signalled is not None:
            self.stop(signalled[0])

    def grace_over(self) -> bool:
        return self.stopped_at is not None and _clock.monotonic() - self.stopped_at >= self._options.grace

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully; a second one stops it
        without waiting for running jobs. Call from the main thread."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.requested.is_set() or self.signalled is not None:
                log.warning("second stop signal: not waiting for running jobs")
                self.stop_from_signal(0.0)
            else:
                log.info("signal %s: stopping after running jobs finish", signal.Signals(signum).name)
                self.stop_from_signal(None)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)


# -- the outbox relay ------------------------------------------------------------
def make_relay(manager: QueueManager, options: WorkerOptions) -> Relay | None:
    """The relay ``WorkerOptions(relay=True)`` asks for; a manager without an outbox is refused now."""
    if not options.relay:
        return None
    from ..outbox.relay import Relay

    return Relay(manager, sleep=options.sleep)


def start_relay(relay: Relay | None, options: WorkerOptions) -> None:
    """At the start of a run: the relay's thread, or (``once``) one relaying of what is committed."""
    if relay is None:
        return
    if options.once:
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


def finish_relay(relay: Relay | None, options: WorkerOptions) -> None:
    """At the end of a run: the relay finishes the batch it is publishing."""
    if relay is None or options.once:
        return
    relay.stop()
    wait = max(options.grace, 5.0)
    if not relay.join(wait):
        log.warning(
            "the outbox relay did not stop within %.0fs; a batch it had not deleted is published again by the "
            "next relay",
            wait,
        )
