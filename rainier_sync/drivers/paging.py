"""What a driver that lists its jobs (``Capabilities.listing``) checks of the page
asked for, and how its name filter matches.

A name filter keeps the jobs whose ``NAME`` contains the text given, ignoring
case; the drivers that match in their server (SQL ``LIKE``, a Lua script) take
it through :func:`like_pattern` or :func:`folded`.
"""

from __future__ import annotations

from ..types import JOB_STATES, JobState

__all__ = ["check_page", "name_filter", "folded", "like_pattern", "LIKE_ESCAPE"]

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
    """``text`` with its case ignored, as the name filter compares it."""
    return text.lower()


def like_pattern(name: str) -> str:
    """A SQL ``LIKE`` pattern matching text that contains ``name`` (its ``%``, ``_`` and
    the escape character taken literally, with ``ESCAPE '!'``)."""
    escaped = name.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2).replace("%", LIKE_ESCAPE + "%").replace("_", LIKE_ESCAPE + "_")
    return f"%{escaped}%"
