"""The worker's shut-down phase: what a stopped worker does with the jobs it
holds. Claimed jobs that never started go back without spending a try; running
ones finish within the grace, and those the grace cuts short are handed back
too (their threads cannot be stopped; the process is on its way out)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from .. import _clock
from ..execution import INTERRUPTED, Completion

if TYPE_CHECKING:
    from ..drivers.base import ConsumerSession, Waker
    from ..types import QueuedJob
    from .attempts import Attempts
    from .control import Control
    from .health import Health
    from .pool import Line
    from .settle import Claims

__all__ = ["Stopping"]

log = logging.getLogger("rainier_sync")


class Stopping:
    """The turns of a :class:`~rainier_sync.Worker` once it is stopped, and the
    claimed jobs that never started, to hand back."""

    def __init__(
        self,
        control: Control,
        attempts: Attempts,
        claims: Claims,
        line: Line,
        session: Callable[[], ConsumerSession],
        health: Health,
        waker: Waker,
    ) -> None:
        self._control = control
        self._attempts = attempts
        self._claims = claims
        self._line = line
        self._session = session
        self._health = health
        self._waker = waker
        #: Claimed jobs that never started, to hand back.
        self.unstarted: list[QueuedJob] = []

    def turn(self, backend_failed: Callable[[], None]) -> bool:
        """A turn once stopped: hand back what never started, settle, wait out the grace
        (``backend_failed`` pauses after a failed backend operation); False when it is over."""
        claims = self._claims
        self.gather_unstarted()
        handed_back = self.give_back()
        settled = claims.settle(_clock.monotonic())
        if handed_back and settled and not claims.held:
            return False
        if self._control.grace_over():
            if self._attempts.interrupt_children():
                self._waker.wait(0.05)
                return True
            self._abandon_running()
            return False
        if not (handed_back and settled):
            backend_failed()
            return True
        self._waker.wait(0.1)
        return True

    def gather_unstarted(self) -> None:
        """Take the jobs waiting in the pool's line, and those a thread declined, to hand back."""
        self.unstarted.extend(self._line.take_unstarted())

    def _hand_back(self, jobs: list[QueuedJob]) -> None:
        """Return jobs that never ran: uncounted where the driver can, else released (counted)."""
        session = self._session()
        if session.capabilities.give_back:
            session.give_back(jobs)
        else:
            for job in jobs:
                session.release(job, 0)

    def give_back(self) -> bool:
        """Hand back the claimed jobs that never started (at stop); False when the backend failed."""
        if not self.unstarted:
            return True
        jobs = self.unstarted
        try:
            self._hand_back(jobs)
        except Exception as exc:  # noqa: BLE001 - retried; at worst their reservations lapse
            self._health.failed("give_back", exc)
            return False
        self.unstarted = []
        self._claims.let_go(jobs)
        return True

    def _abandon_running(self) -> None:
        """The grace is over: hand back the attempts still running in threads, without
        spending a try (their threads cannot be stopped; the process is on its way out)."""
        claims = self._claims
        claims.collect(_clock.monotonic())
        finished = {id(c.job) for c in claims.unsettled}
        cut_short = [job for key, job in claims.running.items() if key not in finished]
        if cut_short:
            try:
                self._hand_back(cut_short)
            except Exception as exc:  # noqa: BLE001 - their reservations lapse and they run again
                self._health.failed("give_back", exc)
                log.warning(
                    "grace period over: %d running job(s) could not be handed back; they run again once "
                    "their reservations lapse",
                    len(cut_short),
                )
            else:
                claims.announce([Completion(job, INTERRUPTED, interrupted=True) for job in cut_short])
        left = len(claims.unsettled)
        if left:
            log.warning(
                "grace period over: %d finished job(s) could not be settled; their reservations will lapse "
                "and another worker will run them again",
                left,
            )
        claims.running.clear()
        self.unstarted = []
