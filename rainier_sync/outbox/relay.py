"""The relay: publishes the outbox's committed rows to their connections, in
order and in batches, and deletes them.

At least once: a row is deleted in the same transaction that took it (or, on
SQLite, once its claim is settled), after its connection accepted the job, so
a relay that dies mid-batch leaves the batch to be published again. Several
relays at once each take rows the others do not hold. A unique job takes its
lock here, and a copy published again after a relay died is dropped once the
first copy has run (its lock let go), or while another copy holds the lock.
"""

from __future__ import annotations

import logging
import select
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Sequence

from .. import _clock, signals
from ..drivers.base import Waker
from ..errors import ConfigurationError, QueueUnavailableError
from ..types import ExceptionInfo, QueuedJob
from .dispatch import relayable
from .publish import Publishing, RelayStats, describe_rows

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..drivers.database.outbox import Outbox
    from ..manager import QueueManager

__all__ = ["Relay", "RelayStats", "BATCH"]

log = logging.getLogger("rainier_sync")

#: Rows a relay takes, publishes and deletes at a time (the default).
BATCH = 500


class Relay(Publishing):
    """Publishes the committed rows of ``manager``'s outbox (or ``outbox``) with
    ``push_many`` on their connections, ``batch`` rows at a time, oldest first,
    and deletes them.

    :meth:`run` blocks until :meth:`stop` (or SIGTERM, with
    :meth:`install_signal_handlers`), waking on the outbox's ``NOTIFY`` on
    PostgreSQL and polling every ``sleep`` seconds elsewhere (and behind a
    pooler: ``listen=false``); :meth:`run_once` relays what is there and
    returns; :meth:`start` runs it in a thread. A connection that is down
    (:class:`~rainier_sync.errors.QueueUnavailableError`) is rested with a
    growing pause while the others go on, its rows kept; a job its connection
    refuses (any other error, the job pushed on its own) is set aside in the
    outbox with the reason, so it never holds up the rows behind it
    (:meth:`Outbox.refused`, :meth:`Outbox.retry_refused`). A manager none of
    whose connections a relay can publish to is refused here.
    """

    def __init__(
        self, manager: QueueManager, *, batch: int = BATCH, sleep: float = 1.0, outbox: Outbox | None = None
    ) -> None:
        outbox = outbox if outbox is not None else manager.outbox
        if outbox is None:
            raise ConfigurationError(
                "the manager declares no outbox, so there is nothing to relay: give QueueManager outbox= "
                "(Outbox.from_url(url)), or write outbox = true on a connection in the queues configuration"
            )
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigurationError(f"relay batch must be a whole number of rows >= 1, got {batch!r}")
        if isinstance(sleep, bool) or not isinstance(sleep, (int, float)) or not sleep >= 0:
            raise ConfigurationError(f"relay sleep must be a number of seconds >= 0, got {sleep!r}")
        self.manager = manager
        self.outbox = outbox
        self.batch = batch
        self.sleep = max(float(sleep), 0.01)
        #: The connections this relay publishes to: those the outbox takes jobs for.
        self.connections = [
            name for name, driver in manager.connections.items() if outbox.covers(name) and relayable(driver)
        ]
        if not self.connections:
            declared = ", ".join(f"{name} ({driver.kind})" for name, driver in manager.connections.items()) or "none"
            raise ConfigurationError(
                f"the outbox relay has no connection to publish to: {outbox.describe()} takes jobs for "
                f"{', '.join(sorted(outbox.connections)) if outbox.connections is not None else 'every connection'} "
                f"that needs it, and none of the manager's does (declared: {declared}); a relay publishes to Redis, "
                "SQS and Kafka connections"
            )
        self.stats = RelayStats()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._listener: Any = None
        #: Per connection: how many failures in a row, and until when it rests (monotonic).
        self._failures: dict[str, int] = {}
        self._resting: dict[str, float] = {}
        #: What failed during this pass, for :meth:`run_once` to raise.
        self._failed_now: list[str] = []
        self._outbox_failures = 0
        self._waker = Waker()

    # -- running -----------------------------------------------------------------------------
    def run_once(self) -> int:
        """Relay what is committed now (batch after batch), then return how many
        rows were relayed. A connection that was down raises
        :class:`~rainier_sync.errors.QueueUnavailableError` at the end, naming
        the rows that stay; a job a connection refused is set aside, not raised."""
        self._look()
        before = self.stats.relayed
        self._failed_now = []
        while not self._stopping:
            try:
                taken = self._pass()
            except Exception as exc:
                self._report("outbox", "relay", exc)
                raise
            if taken < self.batch or self._failed_now:
                break
        if self._failed_now:
            raise QueueUnavailableError("outbox relay: " + "; ".join(self._failed_now))
        return self.stats.relayed - before

    def run(self) -> RelayStats:
        """Relay until :meth:`stop`; the batch being published when it is asked
        to stop is finished first. Returns the stats."""
        self._look()
        try:
            while not self._stopping:
                self._listen()
                self._failed_now = []
                try:
                    taken = self._pass()
                except Exception as exc:  # noqa: BLE001 - reported; tried again after a pause
                    self._outbox_failures += 1
                    self._report("outbox", "relay", exc)
                    self._wait(min(0.05 * 2 ** min(self._outbox_failures, 7), 5.0))
                    continue
                self._outbox_failures = 0
                if taken >= self.batch and not self._failed_now:
                    continue  # more behind it
                self._wait(self._idle_for())
        finally:
            self._close_listener()
        return self.stats

    def start(self) -> threading.Thread:
        """Run the relay in a background thread."""
        if self._thread is not None:
            raise RuntimeError("this relay was already started")
        self._thread = threading.Thread(target=self._run_in_thread, name="rainier-outbox-relay", daemon=True)
        self._thread.start()
        return self._thread

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except Exception:  # noqa: BLE001 - logged; what it held is relayed again
            log.exception("the outbox relay stopped by an error")

    def stop(self) -> None:
        """Stop after the batch being published (safe from any thread and from a signal handler)."""
        self._stopping = True
        self._waker.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a started relay to end; True when it has."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the relay once its batch is published. Call from the main thread."""

        def handle(signum: int, frame: FrameType | None) -> None:
            log.info("signal %s: the outbox relay stops once its batch is published", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- one pass ----------------------------------------------------------------------------
    def _pass(self) -> int:
        now = _clock.monotonic()
        names = [name for name in self.connections if self._resting.get(name, 0.0) <= now]
        return self.outbox.relay_batch(self.batch, names, self._publish)

    # -- failures ----------------------------------------------------------------------------
    def _failed(
        self, name: str, driver: BaseQueue, operation: str, exc: BaseException, items: Sequence[tuple[int, QueuedJob]]
    ) -> None:
        """A connection could not take its jobs (an outage): rest it (longer each time), report it."""
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        pause = min(0.1 * 2 ** min(failures, 6), 5.0)
        self._resting[name] = _clock.monotonic() + pause
        rows = describe_rows(items)
        self._failed_now.append(
            f"connection {name!r} ({driver.describe()}) did not take {len(items)} job(s) ({rows}): {exc}"
        )
        log.warning(
            "outbox relay: connection %r (%s) did not take %d job(s) (%s), which stay in the outbox (trying again "
            "in %.1fs): %s",
            name,
            driver.kind,
            len(items),
            rows,
            pause,
            exc,
        )
        self._report(name, operation, exc, quiet=True)

    def _recovered(self, name: str) -> None:
        self._failures.pop(name, None)
        self._resting.pop(name, None)

    def _report(self, connection: str, operation: str, exc: BaseException, *, quiet: bool = False) -> None:
        info = ExceptionInfo.from_exception(exc)
        if not quiet:
            log.error("outbox relay: %s on %s failed: %s", operation, self.outbox.describe(), info.error)
        signals.emit(
            signals.queue_operation_failed,
            self,
            connection=connection,
            operation=operation,
            error=info.error,
            exception=info,
        )

    def _look(self) -> None:
        """Say what this relay will leave alone: rows for connections it does not
        publish to, and rows set aside as refused."""
        try:
            waiting = self.outbox.waiting_by_connection()
            refused = self.outbox.refused_count()
        except Exception:  # noqa: BLE001 - the first pass reports an outbox that cannot be read
            return
        for name in sorted(set(waiting) - set(self.connections)):
            log.warning(
                "outbox: %d job(s) wait for connection %r, which this manager does not declare for the outbox; "
                "a relay whose manager does will publish them",
                waiting[name],
                name,
            )
        if refused:
            log.warning(
                "outbox: %d row(s) refused by their connection are set aside in %s: outbox:refused lists them and "
                "why, outbox:retry puts them back",
                refused,
                self.outbox.describe(),
            )

    # -- waiting -----------------------------------------------------------------------------
    def _idle_for(self) -> float:
        wait = self.sleep
        if self._resting:
            wait = min(wait, max(0.0, min(self._resting.values()) - _clock.monotonic()))
        return wait

    def _listen(self) -> None:
        """Listen (PostgreSQL) before looking, so a commit in between wakes the next wait."""
        if not self.outbox.listens or (self._listener is not None and not self._listener.closed):
            return
        try:
            conn = self.outbox.open_listener()
        except Exception as exc:  # noqa: BLE001 - this wait polls; the next one tries again
            self._report("outbox", "listen", exc)
            return
        self._listener = conn

    def _wait(self, timeout: float) -> None:
        if self._stopping or timeout <= 0:
            return
        listener = self._listener
        try:
            if listener is None:
                self._waker.wait(timeout)
                return
            readable, _, _ = select.select([listener.fileno(), self._waker.fileno()], [], [], timeout)
            if listener.fileno() in readable:
                pgconn = listener.pgconn  # libpq's own calls: never block
                pgconn.consume_input()
                while pgconn.notifies() is not None:
                    pass
        except Exception as exc:  # noqa: BLE001 - the LISTEN connection was lost: it reopens on the next turn
            log.warning("the outbox relay's LISTEN connection was lost (%s); it reopens on the next wait", exc)
            self._close_listener()
        finally:
            self._waker.clear()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def __repr__(self) -> str:
        return f"<Relay {self.outbox.describe()} -> {', '.join(self.connections) or 'no connection'}>"
