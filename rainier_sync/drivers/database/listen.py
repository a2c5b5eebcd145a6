"""Idle waits: woken by ``LISTEN/NOTIFY`` on PostgreSQL, by polling elsewhere
(SQLite's data version, the newest job's ``seq``), by a push in this process,
or when the soonest delayed job comes due."""

from __future__ import annotations

import select
from typing import Any, Sequence

from ... import _clock
from ..base import Waker
from ._connection import connect
from ._core import DatabaseCore, log
from ._schema import CHANNEL, JOBS


class Waiting(DatabaseCore):
    """``wait_for_jobs`` and the LISTEN connection it may hold."""

    def _soonest(self, queues: Sequence[str]) -> float | None:
        marks = self._sql.marks(len(queues))
        rows = self._worker.query(
            f"SELECT min(available_at) FROM {JOBS} WHERE queue IN ({marks}) AND reserved_at IS NULL", list(queues)
        )
        soonest = rows[0][0] if rows else None
        if soonest is None:
            return None
        if type(soonest) is not float and type(soonest) is not int:
            return _clock.now()  # a due time SQLite holds as text: the claim takes the row now and moves it
        return float(soonest)

    def wait_for_jobs(self, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        """Sleep until a job may be due: a PostgreSQL ``NOTIFY`` from an insert, a
        commit by another SQLite connection, a push in this process, the soonest
        delayed job coming due, or ``waker``."""
        # Start listening (or note SQLite's data version) before looking for the
        # soonest job, so a dispatch between the two is seen by one or the other.
        with self._waiters_lock:
            self._waiters[waker] = frozenset(queues)
        try:
            listener = version = None
            if self._sql.notifies and self.listen:
                try:
                    listener = self._listen()
                except self._backend.db._lost as exc:
                    # Lost while it was being opened: the worker's next turn looks again.
                    log.warning("the LISTEN connection to %s was lost (%s); it reopens on the next wait", self.url, exc)
                    return
            else:
                version = self._data_version()
            soonest = self._soonest(queues) if queues else None
            if soonest is not None:
                timeout = min(timeout, max(0.0, soonest - _clock.now()))
            if timeout <= 0 or waker.is_set():
                return
            if listener is not None:
                self._wait_notified(listener, queues, timeout, waker)
            else:
                self._wait_polling(version, timeout, waker)
        finally:
            with self._waiters_lock:
                self._waiters.pop(waker, None)

    def _listen(self) -> Any:
        with self._listen_lock:
            if self._listener is None or self._listener.closed:
                main = self._backend.db
                conn = connect(
                    self._backend.target,
                    application_name=main.application_name + "-listen",
                    response_timeout=main.response_timeout,
                )
                try:
                    conn.execute(f"LISTEN {CHANNEL}")
                except BaseException:
                    conn.close()
                    raise
                self._listener = conn
            return self._listener

    def _wait_notified(self, listener: Any, queues: Sequence[str], timeout: float, waker: Waker) -> None:
        lost = self._backend.db._lost
        deadline = _clock.monotonic() + timeout
        try:
            while True:
                remaining = deadline - _clock.monotonic()
                if remaining <= 0 or waker.is_set():
                    return
                readable, _, _ = select.select([listener.fileno(), waker.fileno()], [], [], remaining)
                if waker.is_set():
                    return
                if readable:
                    # One thread reads the notifications and wakes every wait they
                    # concern, its own or another worker's on this driver.
                    with self._listen_lock:
                        # libpq's own calls: never block, on every psycopg 3 release.
                        pgconn = listener.pgconn
                        pgconn.consume_input()
                        payloads = set()
                        while (note := pgconn.notifies()) is not None:
                            payloads.add(note.extra.decode())
                    if payloads:
                        self._wake_waiting_on(payloads)
        except lost as exc:
            log.warning("the LISTEN connection to %s was lost (%s); it reopens on the next wait", self.url, exc)
            self._close_listener(listener)
        except (OSError, ValueError):  # the waker was closed under us: a stop
            return

    def _wait_polling(self, version: Any, timeout: float, waker: Waker) -> None:
        deadline = _clock.monotonic() + timeout
        while True:
            remaining = deadline - _clock.monotonic()
            if remaining <= 0:
                return
            if waker.wait(min(self.poll_interval, remaining)):
                return
            if self._data_version() != version:
                return

    def _data_version(self) -> Any:
        """Changes when another connection commits (SQLite); None where it cannot tell."""
        rows = self._worker.query(self._sql.data_version())
        return rows[0][0] if rows else None

    def _wake_waiting_on(self, payloads: set[str]) -> None:
        """Wake the waits for any of these queues (an empty payload wakes every wait)."""
        with self._waiters_lock:
            wake = [w for w, queues in self._waiters.items() if "" in payloads or not payloads.isdisjoint(queues)]
        for waker in wake:
            waker.set()

    def _close_listener(self, only: Any = None) -> None:
        """Close the LISTEN connection (``only``: if it is still that one, not a newer one)."""
        with self._listen_lock:
            if only is not None and self._listener is not only:
                return
            listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
