"""Waiting for a value on PostgreSQL: woken by ``NOTIFY`` instead of polling.

``put_value`` notifies the channel :data:`CHANNEL` with the value's key in its
own statement (delivered when, and only if, it commits). A waiting thread takes
a mark of the key's notifications before it reads the value, so a value put
between the read and the wait still wakes it. The store's one ``LISTEN``
connection is opened on the first wait and shared by every waiting thread: one
of them reads the connection at a time and wakes the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from typing import TYPE_CHECKING, Any, Iterator

from ... import _clock
from . import _connection

if TYPE_CHECKING:
    from ._connection import Database

__all__ = ["CHANNEL", "ValueListener", "notifying_key"]

log = logging.getLogger("rainier_sync")

#: The channel a value's key is notified on when the value is put.
CHANNEL = "rainier_values"
#: A key longer than this is notified as "" (every waiter looks again): NOTIFY payloads stop at 8000 bytes.
_LONGEST_KEY = 7000
#: How long a waiter whose LISTEN connection is down sleeps before it reads the value again.
_POLL = 0.05


def notifying_key(column: str) -> str:
    """The SQL that notifies :data:`CHANNEL` of the key in ``column``."""
    return f"pg_notify('{CHANNEL}', CASE WHEN octet_length({column}) <= {_LONGEST_KEY} THEN {column} ELSE '' END)"


class ValueListener:
    """One LISTEN connection for one lock store, opened lazily and shared by its waiting threads."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn: Any = None
        self._pid = 0
        self._changed = threading.Condition(threading.Lock())
        #: Whether a waiting thread is reading the connection now.
        self._reading = False
        #: Keys being waited for, and how many threads wait for each.
        self._waiting: dict[str, int] = {}
        #: How many notifications each waited-for key has had; ``_all`` those that concern every key.
        self._heard: dict[str, int] = {}
        self._all = 0

    @contextlib.contextmanager
    def watching(self, key: str) -> Iterator[None]:
        """While inside, notifications of ``key`` are kept for :meth:`mark`."""
        with self._changed:
            self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                left = self._waiting[key] - 1
                if left:
                    self._waiting[key] = left
                else:
                    del self._waiting[key]
                    self._heard.pop(key, None)

    def mark(self, key: str) -> int:
        """How many notifications ``key`` has had: take it before reading the value."""
        with self._changed:
            return self._heard.get(key, 0) + self._all

    def wait(self, key: str, mark: int, timeout: float) -> None:
        """Return once ``key`` is notified after ``mark`` was taken, or after ``timeout``
        seconds (sooner while the LISTEN connection cannot be had)."""
        deadline = _clock.monotonic() + timeout
        with self._changed:
            while self._heard.get(key, 0) + self._all == mark:
                left = deadline - _clock.monotonic()
                if left <= 0:
                    return
                if self._reading:
                    self._changed.wait(left)
                    continue
                conn = self._connection()
                if conn is None:  # cannot listen now: look at the value again soon
                    self._changed.wait(min(left, _POLL))
                    return
                self._reading = True
                self._changed.release()
                try:
                    heard = self._read(conn, left)
                finally:
                    self._changed.acquire()
                    self._reading = False
                if heard is None:  # the connection was lost: every waiter looks again
                    self._all += 1
                for name in heard or ():
                    if name == "":
                        self._all += 1
                    elif name in self._waiting:
                        self._heard[name] = self._heard.get(name, 0) + 1
                self._changed.notify_all()

    def listen(self) -> bool:
        """Open the connection now (before a waiter's first read); False when it cannot be."""
        with self._changed:
            return self._connection() is not None

    def _connection(self) -> Any:
        """The LISTEN connection, opened if need be (called holding the condition)."""
        if self._conn is not None and self._pid == os.getpid() and not self._conn.closed:
            return self._conn
        if self._pid != os.getpid():
            self._conn = None  # the parent process's: never touched from a child
        try:
            conn = _connection.connect(
                self._db.target,
                application_name=self._db.application_name + "-values",
                response_timeout=self._db.response_timeout,
            )
        except Exception as exc:  # noqa: BLE001 - waits poll until it can be opened
            log.warning("cannot LISTEN for values on %s (%s): waits poll meanwhile", self._db.target.where, exc)
            return None
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except Exception as exc:  # noqa: BLE001 - as above
            conn.close()
            log.warning("cannot LISTEN for values on %s (%s): waits poll meanwhile", self._db.target.where, exc)
            return None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _read(self, conn: Any, timeout: float) -> set[str] | None:
        """Wait up to ``timeout`` for notifications and read them; None when the connection is lost."""
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], timeout)
            if not readable:
                return set()
            # libpq's own calls: they never block.
            pgconn = conn.pgconn
            pgconn.consume_input()
            heard: set[str] = set()
            while (note := pgconn.notifies()) is not None:
                heard.add(note.extra.decode())
            return heard
        except Exception as exc:  # noqa: BLE001 - lost: reopened on the next wait
            log.warning("the LISTEN connection for values on %s was lost (%s)", self._db.target.where, exc)
            with contextlib.suppress(Exception):
                conn.close()
            with self._changed:
                if self._conn is conn:
                    self._conn = None
            return None

    def close(self) -> None:
        with self._changed:
            conn, self._conn = self._conn, None
            mine = self._pid == os.getpid()
        if conn is not None and mine:
            with contextlib.suppress(Exception):
                conn.close()
