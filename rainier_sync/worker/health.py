"""How a worker's backend has been doing: each failed operation reported (log
and ``queue_operation_failed``), the current run of failures, whether it has
answered yet, and when a ``once`` run gives up on it; and :class:`WorkerHealth`,
what :meth:`Worker.health` reports."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from .. import _clock, signals
from .._text import escaped
from ..errors import QueueUnavailableError
from ..types import ExceptionInfo

__all__ = ["Health", "WorkerHealth", "HealthFile", "Turns", "is_outage"]

log = logging.getLogger("rainier_sync")

#: Seconds between touches of a worker's health file.
TOUCH_EVERY = 1.0


@dataclass(frozen=True)
class WorkerHealth:
    """What :meth:`Worker.health` reports: the facts a liveness probe judges.

    - ``last_turn_age``: seconds since the owning loop last began a turn
      (None before the worker runs). A loop that stops turning is wedged,
      whatever its threads are doing.
    - ``running``: attempts running in the pool's threads now.
    - ``held``: jobs claimed and not yet settled (waiting, running or finished).
    - ``stopping``: :meth:`Worker.stop` was called.
    - ``last_error``: the last failed backend operation (``"operation: error"``;
      ``""`` when none failed).
    - ``failing_since``: when the current run of backend failures began, in
      seconds since the epoch; None while the backend answers.
    """

    last_turn_age: float | None
    running: int
    held: int
    stopping: bool
    last_error: str
    failing_since: float | None


class HealthFile:
    """A file whose mtime says the owning loop still turns (``--health-file``).

    Touched at most once per :data:`TOUCH_EVERY` seconds of the loop's clock,
    so a busy loop pays one clock comparison per turn.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._next = 0.0
        self._warned = False

    def turn(self, now: float) -> None:
        """A loop turn at monotonic time ``now``: touch the file when the last touch is old enough."""
        if now < self._next:
            return
        self._next = now + TOUCH_EVERY
        try:
            try:
                os.utime(self.path)
            except FileNotFoundError:
                with open(self.path, "a", encoding="utf-8"):
                    pass
        except OSError as exc:
            # The probe fails on its own once the file ages; say why once, not every second.
            if not self._warned:
                self._warned = True
                log.warning("cannot touch the health file %s: %s", self.path, exc)
            return
        self._warned = False


class Turns:
    """When the owning loop last began a turn, and the health file that says so."""

    def __init__(self, health_file: str | None) -> None:
        #: When the owning loop last began a turn (monotonic; None before the run).
        self.last: float | None = None
        self.file = HealthFile(health_file) if health_file else None

    def turn(self, now: float) -> None:
        """The loop begins a turn at monotonic time ``now``."""
        self.last = now
        if self.file is not None:
            self.file.turn(now)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the backend cannot be reached (yet), rather than that it
    answered and refused: an outage is ridden out, a refusal is a configuration error."""
    return isinstance(exc, (QueueUnavailableError, ConnectionError, TimeoutError))


class Health:
    """The failures of one worker's backend operations."""

    def __init__(self, sender: Any, connection: str | None, *, once: bool, give_up: float) -> None:
        self.sender = sender
        self.connection = connection
        self.once = once
        self.give_up = give_up
        self.last_error = ""
        #: When the current run of failures began (None: the last operation worked).
        self.failing_since: float | None = None
        self.failures = 0
        #: Whether a claim has gone through since :meth:`begin`.
        self.answered = False

    def begin(self) -> None:
        """A run begins: no failures yet, and no claim has gone through yet."""
        self.clear()
        self.answered = False

    def clear(self) -> None:
        """The backend answered an operation: the run of failures is over."""
        self.failures = 0
        self.failing_since = None

    @property
    def named(self) -> str:
        """The connection as messages name it."""
        return "the default connection" if self.connection is None else f"connection {self.connection!r}"

    def call(self, operation: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; a failure is reported and None returned (the loop retries with a backoff)."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported, retried by the loop with a backoff
            self.failed(operation, exc)
            return None

    def failed(self, operation: str, exc: BaseException) -> None:
        """Report a failed operation: logged, and ``queue_operation_failed`` sent."""
        info = ExceptionInfo.from_exception(exc)
        self.last_error = f"{operation}: {info.error}"
        if self.failing_since is None:
            self.failing_since = _clock.monotonic()
        log.error("queue operation %s on %s failed: %s", operation, self.named, escaped(info.error))
        signals.emit(
            signals.queue_operation_failed,
            self.sender,
            connection=self.connection,
            operation=operation,
            error=info.error,
            exception=info,
        )

    def ok(self) -> None:
        """A claim went through: the run of failures is over."""
        self.clear()
        self.answered = True

    def backoff(self) -> float:
        """After a failure: how long to pause (longer each time, at most 5 s).

        A resident worker keeps trying for as long as it runs; a ``once`` worker
        (a cron run) gives up once the backend has kept failing for ``give_up``
        seconds, so the run ends with an error instead of hanging until the next
        one starts.
        """
        self.failures += 1
        if self.once:
            self.check_give_up()
        return float(min(0.05 * 2 ** min(self.failures, 7), 5.0))

    def check_give_up(self) -> None:
        """End a ``once`` run whose backend has kept failing for ``give_up`` seconds."""
        since = self.failing_since
        if since is None:
            return
        failing = _clock.monotonic() - since
        if failing < self.give_up:
            return
        if not self.answered:
            raise QueueUnavailableError(
                f"{self.named} has not answered since the worker started: it kept failing for "
                f"{failing:.1f}s; giving up this --once run (last error: {self.last_error})"
            )
        raise QueueUnavailableError(
            f"{self.named} kept failing for {failing:.1f}s; giving up this --once run "
            f"(last error: {self.last_error})"
        )
