"""Text from outside the process, made safe to log."""

from __future__ import annotations

__all__ = ["escaped"]


def escaped(value: object) -> str:
    """``value`` as text with every unprintable character escaped as ``repr`` would
    (``\\n``, ``\\x00``, ``\\u2028``), so a stored job's name, queue, id or error
    text can neither forge a log line nor write a raw control byte; printable
    text, non-ASCII letters included, stays as it is."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
