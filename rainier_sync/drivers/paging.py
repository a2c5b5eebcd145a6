"""What a driver that lists its jobs (``Capabilities.listing``) checks of the page
asked for, and how its name filter matches.

A name filter keeps the jobs whose ``NAME`` contains the text given, ignoring
the case of the letters A to Z (PostgreSQL and MariaDB fold other letters too);
the drivers that match in their server (SQL ``LIKE``, a Lua script) take it
through :func:`like_pattern` or :func:`folded`.
"""

from __future__ import annotations

from ..types import JOB_STATES, JobState, ListedJob

__all__ = ["Page", "check_page", "name_filter", "folded", "like_pattern", "LIKE_ESCAPE"]

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: The escape character of :func:`like_pattern` (``ESCAPE '!'``: the same literal in every SQL dialect,
#: where a backslash is not).
LIKE_ESCAPE = "!"


def check_page(state: object, offset: object, limit: object) -> JobState:
    """``state``, once ``offset`` and ``limit`` are whole numbers from 0: ``ValueError`` naming what is wrong."""
    if state not in JOB_STATES:
        raise ValueError(f"list_jobs: state must be one of {', '.join(JOB_STATES)}, got {state!r}")
    for what, value in (("offset", offset), ("limit", limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"list_jobs: {what} must be a whole number from 0, got {value!r}")
    return state


def name_filter(name: object) -> str | None:
    """The filter text, or None for no filter (``None`` or ``""``)."""
    if name is None or name == "":
        return None
    if not isinstance(name, str):
        raise ValueError(f"list_jobs: name must be text, got {name!r}")
    return name


def folded(text: str) -> str:
    """``text`` with the case of A to Z ignored, as the name filter compares it
    (the same in every driver that folds it itself: Lua's ``string.lower``)."""
    return text.translate(_ASCII_LOWER)


class Page(list[ListedJob]):
    """A page of :meth:`~rainier_sync.drivers.extensions.ListsJobs.list_jobs` (the database and
    Redis drivers return one): a list, which also says how far a name filter looked.

    A name filter looks at no more than ``bound`` jobs of the state, from the
    first in its order, so that a page costs the same with 100,000 jobs queued as
    with 10,000; ``complete`` is False when it stopped there before the page was
    full (jobs further on were not looked at).
    """

    #: The most jobs the name filter looked at (None: no filter, or no bound).
    bound: int | None = None
    #: False when the filter stopped at ``bound`` before filling the page.
    complete: bool = True


def like_pattern(name: str) -> str:
    """A SQL ``LIKE`` pattern matching text that contains ``name`` (its ``%``, ``_`` and
    the escape character taken literally, with ``ESCAPE '!'``)."""
    escaped = name.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2).replace("%", LIKE_ESCAPE + "%").replace("_", LIKE_ESCAPE + "_")
    return f"%{escaped}%"
