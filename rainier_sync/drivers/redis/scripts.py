"""The Redis driver's Lua scripts, read from ``lua/*.lua``.

Every multi-step change to a queue is one script, so it is atomic. A script's
header names the shared pieces it needs (``-- needs: push_lib held``); they are
put before its body. Header comments are left out of what is sent.

The queue's scripts are sent with a ``#!lua`` line: in that mode Redis Cluster
refuses a script that touches keys of two slots even when one node serves both,
so a key outside the queue's hash tag fails every time, not one time in three.
Every key a script touches is in its KEYS, or is a band's stream built from
the queue's own ``bands`` key (lua/stream.lua).
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["SOURCES", "Script", "source"]

_NEEDS = "-- needs:"


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def source(name: str) -> str:
    """The text of script ``name``, with the pieces it needs before it."""
    lines = _read(name).splitlines(keepends=True)
    needs: list[str] = []
    while lines and lines[0].startswith("--"):
        if lines[0].startswith(_NEEDS):
            needs = lines[0][len(_NEEDS) :].split()
        lines.pop(0)
    return "".join(source(piece) for piece in needs) + "".join(lines)


#: Script flags beyond the default (a script that writes).
_FLAGS = {name: " flags=no-writes" for name in ("counts", "browse")}

#: The queue's scripts by name, registered with each client (run by EVALSHA, by EVAL when not cached).
SOURCES = {
    name: f"#!lua{_FLAGS.get(name, '')}\n" + source(name)
    for name in (
        "push",
        "push_one",
        "reserve",
        "ack",
        "count_ack",
        "adopt",
        "release",
        "fail",
        "extend",
        "reclaim",
        "retry",
        "forget",
        "counts",
        "browse",
        "find",
    )
}


class Script:
    """A script's text and the SHA1 that ``EVALSHA`` names it by."""

    __slots__ = ("name", "text", "sha")

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 - the name Redis gives a script
