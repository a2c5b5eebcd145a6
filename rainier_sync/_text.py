"""Text from outside the process, made safe to log."""

from __future__ import annotations

__all__ = ["escaped", "LOGGED_ERROR"]


#: The most of one error text a log line carries: the whole is in the failed store.
LOGGED_ERROR = 4096


def escaped(value: object, limit: int | None = None) -> str:
    """``value`` as text with every unprintable character escaped as ``repr`` would
    (``\\n``, ``\\x00``, ``\\u2028``), so a stored job's name, queue, id or error
    text can neither forge a log line nor write a raw control byte; printable
    text, non-ASCII letters included, stays as it is. With ``limit``, at most that
    many characters of it, and how many more there were."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        return escaped(text[:limit]) + f"... ({len(text) - limit:,} more characters)"
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
