"""The Redis driver's Lua scripts, read from ``lua/*.lua``.

Every multi-step change to a queue is one script, so it is atomic. A script's
header names the shared pieces it needs (``-- needs: push_lib held``); they are
put before its body. Header comments are left out of what is sent.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["SOURCES", "source"]

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


#: The queue's scripts by name, registered with each client (run by EVALSHA, by EVAL when not cached).
SOURCES = {
    name: source(name)
    for name in (
        "push",
        "push_one",
        "reserve",
        "ack",
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
