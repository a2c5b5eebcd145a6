"""How the commands print: tables, times, a progress line."""

from __future__ import annotations

import shutil
import sys
import time
from datetime import datetime, timezone
from typing import IO, Sequence

from .._text import escaped

__all__ = ["when", "table", "Progress", "SQUEEZED_WIDTH"]

#: How much of a long cell (a failed job's error) a list shows off a terminal.
SQUEEZED_WIDTH = 100


def when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def table(
    out: IO[str],
    headers: list[str],
    rows: list[list[str]],
    *,
    squeeze: int | None = None,
    numeric: Sequence[int] = (),
) -> None:
    """Columns padded to fit; column ``squeeze`` is cut to the terminal's width
    (off a terminal, to :data:`SQUEEZED_WIDTH` characters). Cells are escaped
    (:func:`~rainier_sync._text.escaped`): a stored value cannot break a row."""
    rows = [[escaped(cell) for cell in row] for row in rows]
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    if squeeze is not None:
        room = SQUEEZED_WIDTH
        if out.isatty():
            room = max(20, shutil.get_terminal_size((120, 24)).columns - sum(w + 2 for w in widths[:squeeze]))
        widths[squeeze] = max(len(headers[squeeze]), min(widths[squeeze], room))
        for row in rows:
            if len(row[squeeze]) > widths[squeeze]:
                row[squeeze] = row[squeeze][: widths[squeeze] - 3] + "..."

    def line(cells: list[str]) -> str:
        parts = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        return "  ".join(parts).rstrip() + "\n"

    out.write(line(headers))
    for row in rows:
        out.write(line(row))


class Progress:
    """``label: done/total`` redrawn on a terminal (stderr), silent otherwise."""

    def __init__(self, label: str, total: int, stream: IO[str] | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = total > 0 and self.stream.isatty()
        self._last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or done == self.total):
            self._last = now
            self.stream.write(f"\r{self.label}: {done}/{self.total} ({100 * done // self.total}%)")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


