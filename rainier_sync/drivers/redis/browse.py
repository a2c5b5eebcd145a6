"""The Redis driver's listing (``Capabilities.listing``): a page of one state's
jobs and one job by id, each read by a Lua script in the server so that only
what is shown crosses the wire.

- ``ready``: each band's stream entries the group has not delivered yet, bands
  lowest first, each followed by the due delayed jobs the next reserve moves
  onto it: the order reserve hands them out.
- ``delayed``: the delayed set's members due later, by due time.
- ``reserved``: the reservations (``P<queue>:reserved``), by deadline.

Each script reads one queue's keys (in its KEYS), so it runs in one slot on a cluster.

An entry an idle worker's blocking read has just taken is in no state until
that worker records its reservation, a moment later (one whose worker died
first is put back by ``reclaim_expired`` once a reservation has passed).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ... import _clock
from ...errors import PayloadError
from ...types import JobState, ListedJob, QueuedJob
from ..paging import Page, check_page, folded, name_filter
from .core import _RedisCore
from .wire import _GROUP, _PROMOTE, _entry_job, _num, _raw_fields, _unreadable

__all__ = ["_Browsing"]

log = logging.getLogger("rainier_sync")

#: Jobs a name filter looks at, at most, per page (from the first of the state).
LISTING_SCAN = 10_000
#: Jobs one script call looks at, at most (listing and ``find_job``): each call holds
#: the server for a few milliseconds at most, and a page takes as many as it needs.
CALL_BUDGET = 2_000
#: The characters of an unreadable entry kept in its listing.
_RAW_SHOWN = 4000


def _json_text(text: str, ascii_only: bool) -> str:
    """``text`` as it appears inside a JSON string, escaped as the driver writes
    envelopes (``ascii_only``: as a retried job's record has it)."""
    return json.dumps(text, ensure_ascii=ascii_only)[1:-1]


def _both(text: str) -> tuple[str, str]:
    """``text`` as an envelope spells it, and as ASCII JSON does when that differs ('' if not)."""
    plain, ascii_ = _json_text(text, False), _json_text(text, True)
    return plain, ascii_ if ascii_ != plain else ""


class _Browsing(_RedisCore):
    """``list_jobs`` and ``find_job`` of ``RedisQueue``."""

    #: Jobs a name filter looks at per page, at most (counted from the first of the state);
    #: the page says when it stopped there (:class:`~rainier_sync.drivers.paging.Page`).
    listing_scan: int = LISTING_SCAN

    def list_jobs(
        self, queue: str, state: JobState, *, name: str | None = None, offset: int = 0, limit: int = 50
    ) -> Page:
        """A page of ``queue``'s jobs in ``state`` (see :mod:`.browse` for what each
        state holds), read by a script in the server.

        ``name`` keeps the jobs whose ``NAME`` contains it, ignoring the case of A
        to Z. A filtered page looks at no more than :attr:`listing_scan` jobs of
        the state, from its first: the returned :class:`~rainier_sync.drivers.paging.Page`
        has ``complete`` False when it stopped there before the page was full
        (it may say so too when the state holds exactly that many). Without a filter the server skips ``offset`` jobs
        (whole bands and sorted-set ranges without reading them, stream entries
        by reading them in the server). Each script call looks at no more than
        :data:`CALL_BUDGET` jobs, so a page that needs more takes several calls
        and never holds the server long; jobs that move meanwhile may be missed
        or shown twice, as between two pages.

        An entry that cannot be read is listed as a stand-in (as the failed store
        would name it) with ``job.meta["unreadable"]`` saying why and
        ``meta["raw"]`` what it holds; a worker's reserve moves it to the failed store.
        """
        state = check_page(state, offset, limit)
        needle = name_filter(name)
        page = Page()
        if limit == 0:
            return page
        plain, ascii_ = _both(folded(needle)) if needle is not None else ("", "")
        bound = max(1, int(self.listing_scan))
        self._sync()  # this process's acknowledgements first: a job done here is listed no more
        keys = self.keys.queue_keys(queue)
        now = _num(_clock.now())  # one "now" for every call of the page
        cursor: list[Any] = ["", "", ""]
        skip, looked, items = offset, 0, list[Any]()
        while True:
            budget = CALL_BUDGET if needle is None else min(CALL_BUDGET, bound - looked)
            args = (_GROUP, state, now, skip, limit - len(items), plain, ascii_, budget, _PROMOTE)

            def walk(args: tuple[Any, ...] = (*args, *cursor)) -> Any:
                return self._run("browse", keys, list(args))

            reply: Any = self._call("list_jobs", walk)
            looked += int(reply[0])
            skip, cursor = int(reply[1]), [part.decode() for part in reply[2:5]]
            items.extend(reply[5:])
            if len(items) >= limit or cursor[0] == "end":
                break
            if needle is not None and looked >= bound:
                page.complete = False
                log.debug("queue %r: a name filter looked at the first %d %s jobs only", queue, looked, state)
                break
        page.bound = bound if needle is not None else None
        page.extend(self._listed(queue, state, item) for item in items)
        return page

    def find_job(self, id: str) -> ListedJob | None:
        """The job ``id`` (ready, delayed or reserved), or None: one look per queue in
        the queue's id index (``P<queue>:ids``, kept by every script that moves a job).

        A queue that held jobs before the index existed is read once instead, in
        the server, :data:`CALL_BUDGET` jobs per script call, each recorded in the
        index; a search that reads all of it marks the index whole, and later ones
        look there."""
        plain, ascii_ = _both(id)
        needle = f'{{"id":"{plain}"'
        needle2 = f'{{"id":"{ascii_}"' if ascii_ else ""
        self._sync()
        for queue in self.queue_names():
            cursor = ["reserved", "", "0"]
            keys = self.keys.queue_keys(queue)
            while True:
                args = (needle, *cursor, CALL_BUDGET, needle2, id)

                def look(args: tuple[Any, ...] = args, keys: list[str] = keys) -> Any:
                    return self._run("find", keys, list(args))

                reply: Any = self._call("find_job", look)
                status = reply[0]
                if status == b"end":
                    break
                cursor = [part.decode() for part in reply[1:4]]
                if status == b"found":
                    listed = self._listed(queue, None, reply[4])
                    if listed.job.id == id:
                        return listed
        return None

    def _listed(self, queue: str, state: JobState | None, item: list[Any]) -> ListedJob:
        """One item of a script's reply as a listing shows it (``state`` None: as
        the item tells it, for ``find_job``)."""
        kind = item[0]
        if kind == b"d":
            member, due = item[1], float(item[2])
            job = self._delayed_job(queue, member, due)
            return ListedJob(job, state or ("ready" if due <= _clock.now() else "delayed"))
        band, entry, fields = item[1], item[2], item[3 if kind == b"s" else 4]
        if not fields:
            job = self._stand_in(queue, band, entry, PayloadError("its stream entry is gone"), "")
        else:
            try:
                job = _entry_job(queue, band, entry, fields, self.connection)
            except Exception as exc:  # noqa: BLE001 - whatever makes it unreadable, the page still shows it
                job = self._stand_in(queue, band, entry, exc, _raw_fields(fields))
            else:
                job.receipt = None  # a listing is no claim: nothing settles a job through it
                if kind == b"s":
                    job.attempts -= 1  # counted as a reserve counts it; a ready job has not started this one
        if kind == b"r":
            return ListedJob(job, "reserved", float(item[3]))
        return ListedJob(job, "ready")

    def _delayed_job(self, queue: str, member: bytes, due: float) -> QueuedJob:
        """A delayed set member (``band|attempts|envelope``) as a job, due at its score."""
        band, _, rest = member.partition(b"|")
        attempts, _, body = rest.partition(b"|")
        try:
            if not (attempts.isdigit() and len(attempts) <= 9 and band.lstrip(b"-").isdigit()):
                raise PayloadError("the delayed job was not written by this driver")
            job = QueuedJob.decode(body, connection=self.connection)
        except Exception as exc:  # noqa: BLE001 - shown, never raised
            raw = member.decode("utf-8", "replace")
            stand_in = self._stand_in(queue, b"0", f"delayed-{due!r}".encode(), exc, raw)
            stand_in.available_at = due
            return stand_in
        job.attempts = int(attempts)
        job.available_at = due  # the score: a release with a delay keeps the envelope it came with
        return job

    def _stand_in(self, queue: str, band: bytes, entry: bytes, exc: Exception, raw: str) -> QueuedJob:
        failed_id, stand_in = _unreadable(queue, band, entry)
        why = str(exc) if isinstance(exc, PayloadError) else f"{type(exc).__name__}: {exc}"
        return QueuedJob(
            id=failed_id,
            name=stand_in["name"],
            queue=queue,
            payload={},
            connection=self.connection,
            priority=int(band) if band.lstrip(b"-").isdigit() else 0,
            meta={"unreadable": why, "raw": raw[:_RAW_SHOWN]},
        )
