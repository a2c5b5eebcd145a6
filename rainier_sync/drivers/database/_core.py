"""What every part of ``DatabaseQueue`` shares: its settings, its connections,
its dialect, and the in-process wake-ups of idle waits."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Sequence

from ..._checks import check_number
from ...types import ExceptionInfo, QueuedJob, encode
from ..base import BaseQueue, Capabilities, QueueDriver, Waker
from ..extensions import CountsRetries, DispatchesWithin, HandsOver, LendsLocks, ListsJobs, StreamsPush
from .backend import _Backend
from .dialects import dialect_for, job_row
from .spec import PROMISES
from .url import POSTGRESQL, SQLITE, DatabaseUrl

log = logging.getLogger("rainier_sync")

_CLAIM_PATHS = ("skip_locked", "optimistic")


class DatabaseCore(BaseQueue, DispatchesWithin, StreamsPush, HandsOver, CountsRetries, ListsJobs, LendsLocks):
    """The state the producer side, the claims, the failed store and the waits share."""

    driver = QueueDriver.DATABASE
    promises = PROMISES
    capabilities = Capabilities(
        give_back=True,
        wakes=True,
        transactional_dispatch=True,
        migrations=True,
        listing=True,
        hands_over=True,
        counts_batches=True,
        counts_retries=True,
        lends_locks=True,
    )

    def __init__(
        self,
        url: str,
        *,
        reservation: float = 90,
        claim: str | None = None,
        poll_interval: float | None = None,
        reconnect_for: float | None = None,
        response_timeout: float | None = None,
        application_name: str = "rainier_sync",
        synchronous_commit: bool = False,
        listen: bool | None = None,
    ) -> None:
        check_number("reservation", reservation, unit="seconds")
        self.reservation: float = float(reservation)
        target = DatabaseUrl.parse(url)
        if listen is not None:
            if not isinstance(listen, bool):
                raise ValueError(f"listen must be True or False, got {listen!r}")
            target = replace(target, listen=listen)
        #: Whether idle workers wait on ``LISTEN/NOTIFY`` (PostgreSQL) rather than polling.
        self.listen = target.listen
        self.dialect = target.dialect
        self._sql = dialect_for(self.dialect)
        if claim is None:
            claim = self._sql.default_claim
        if claim not in _CLAIM_PATHS:
            raise ValueError(f"claim must be one of {', '.join(_CLAIM_PATHS)}, got {claim!r}")
        if claim == "skip_locked" and self.dialect != POSTGRESQL:
            raise ValueError(f"claim='skip_locked' needs PostgreSQL; the {self.dialect} database uses 'optimistic'")
        self.claim = claim
        self.capabilities = Capabilities(
            give_back=True,
            wakes=True,
            transactional_dispatch=True,
            migrations=True,
            combined_claim=claim == "skip_locked" or self.dialect == SQLITE,
            streaming_push=self.dialect == POSTGRESQL,
            listing=True,
            hands_over=True,
            counts_batches=True,
            counts_retries=True,
            lends_locks=True,
        )
        if poll_interval is None:
            poll_interval = self._sql.poll_interval
        check_number("poll_interval", poll_interval, unit="seconds")
        self.poll_interval = float(poll_interval)
        self.url = target.redacted
        self._backend = _Backend(
            target, reconnect_for=reconnect_for, response_timeout=response_timeout, application_name=application_name
        )
        self._consumer: _Backend | None = None if target.dialect == POSTGRESQL else self._backend
        self._consumer_lock = threading.Lock()
        # A session setting would outlive its transaction in a pool and reach other clients.
        self._consumer_init = () if synchronous_commit or not target.listen else ("SET synchronous_commit TO off",)
        #: Each idle wait's waker and the queues it waits for.
        self._waiters: dict[Waker, frozenset[str]] = {}
        self._waiters_lock = threading.Lock()
        self._listener: Any = None
        #: Serialises opening the LISTEN connection and reading its notifications:
        #: several workers in one process may wait on this driver at once.
        self._listen_lock = threading.Lock()

    @property
    def _worker(self) -> _Backend:
        """The connection for claims and acknowledgements (the worker's owning loop)."""
        consumer = self._consumer
        if consumer is None:
            with self._consumer_lock:
                if self._consumer is None:
                    main = self._backend.db
                    self._consumer = _Backend(
                        self._backend.target,
                        reconnect_for=main.reconnect_for,
                        response_timeout=main.response_timeout,
                        application_name=main.application_name,
                        init=self._consumer_init,
                    )
                consumer = self._consumer
        return consumer

    def _held(self, jobs: Sequence[QueuedJob]) -> tuple[str, list[Any]]:
        """A WHERE clause matching exactly these reservations: the rows claimed
        (``seq``) with their claim tokens. A token is only ever written by the
        claim that made it, so a row another worker claimed since does not match."""
        claimed = [job.receipt for job in jobs if isinstance(job.receipt, tuple)]
        if len(claimed) < len(jobs):  # not from reserve(): by job id (no index; an unusual call)
            return self._sql.by_ids([job.id for job in jobs])
        return self._sql.held([seq for seq, _ in claimed], sorted({token for _, token in claimed}))

    def _failed_row(
        self, job_id: str, queue: str, name: str, body: str, info: ExceptionInfo, attempts: int, when: float
    ) -> tuple[Any, ...]:
        """The values of the failed store's upsert, every text as the columns hold it.

        A text the dialect cannot hold as it is (a NUL in PostgreSQL text, a lone
        surrogate anywhere) is stored escaped rather than refused, so one record
        never fails its worker's settlement: the JSON columns (body, exception)
        read back as they were; the id, queue, name and error columns keep the
        escape, and the error says so."""
        sql = self._sql
        body, _ = sql.storable(body)
        exception, _ = sql.storable(encode(info.to_dict()))
        error, in_error = sql.storable(info.error)
        job_id, in_id = sql.storable(job_id)
        queue, in_queue = sql.storable(queue)
        name, in_name = sql.storable(name)
        escaped = [
            f"{how} in its {field}"
            for field, done in (("error", in_error), ("id", in_id), ("queue", in_queue), ("name", in_name))
            for how in done
        ]
        if escaped:
            note = "; ".join(escaped)
            log.warning(
                "job %s (%s) goes to the failed store with %s: %s text cannot hold it as it was",
                job_id,
                name,
                note,
                self.dialect,
            )
            error += f" [stored escaped: {note}]"
        return (job_id, queue, name, body, sql.error_column(error), exception, attempts, when)

    def _insert_follow(self, cursor: Any, follow: Sequence[QueuedJob]) -> None:
        """Insert the jobs a settled job hands over, in the transaction that settles it."""
        insert = self._sql(self._sql.insert_one())
        for queued in follow:
            cursor.execute(insert, job_row(queued))

    def _wake_local(self) -> None:
        if self._waiters:
            with self._waiters_lock:
                waiters = list(self._waiters)
            for waker in waiters:
                waker.set()


def column_text(value: Any) -> str:
    """A column as text for the failed store, whatever the row held."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    return str(value)
