"""The dashboard's charts as plain numbers for its inline SVG (no script): the
fleet's throughput and the fleet's wait times, both read from the counts every
worker adds to the lock store."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..fleet import wait_percentile

if TYPE_CHECKING:
    from ..fleet import MinuteCounts

__all__ = ["Chart", "WaitChart", "build_fleet_chart", "build_wait_chart", "FLEET_SEGMENTS", "duration"]


@dataclass
class Chart:
    """The throughput chart as plain numbers for the SVG template."""

    width: int
    height: int
    bars: list[dict[str, Any]]
    peak: int
    labels: list[dict[str, Any]]


#: The fleet chart's segments, bottom up: outcome, colour, words.
FLEET_SEGMENTS = (
    ("processed", "#2e7d32", "processed"),
    ("released", "#c17900", "released for a retry"),
    ("failed", "#c62828", "failed"),
    ("deferred", "#6a1b9a", "deferred"),
)


def build_fleet_chart(minutes: list[MinuteCounts], width: int = 600, height: int = 110) -> Chart:
    """Bars: what every worker finished per minute (processed, released, failed, deferred, stacked)."""
    totals = [[row.total(outcome) for outcome, _, _ in FLEET_SEGMENTS] for row in minutes]
    peak = max((sum(counts) for counts in totals), default=0)
    scale = (height - 20) / peak if peak else 0.0
    slot = width / max(len(minutes), 1)
    bars: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    base = height - 14
    for index, (row, counts) in enumerate(zip(minutes, totals, strict=True)):
        x = round(index * slot + 1, 1)
        w = round(max(slot - 2, 1), 1)
        stamp = datetime.datetime.fromtimestamp(row.minute, tz=datetime.timezone.utc).strftime("%H:%M")
        title = f"{stamp} UTC: " + ", ".join(
            f"{n} {words}" for n, (_, _, words) in zip(counts, FLEET_SEGMENTS, strict=True)
        )
        top = float(base)
        for n, (_, fill, _) in zip(counts, FLEET_SEGMENTS, strict=True):
            h = round(n * scale, 1)
            top -= h
            bars.append({"x": x, "y": round(top, 1), "w": w, "h": h, "fill": fill, "title": title})
        if index % 10 == 0 or index == len(minutes) - 1:
            labels.append(_label(index, len(minutes), round(x + w / 2, 1), width, stamp))
    return Chart(width=width, height=height, bars=bars, peak=peak, labels=labels)


def _label(index: int, count: int, x: float, width: int, text: str) -> dict[str, Any]:
    """A time under the x axis; the first and the last kept inside the chart."""
    if index == 0:
        return {"x": 1, "text": text, "anchor": "start"}
    if index == count - 1:
        return {"x": width - 1, "text": text, "anchor": "end"}
    return {"x": x, "text": text, "anchor": "middle"}


def duration(seconds: float) -> str:
    """A wait for people to read: ``4 ms``, ``1.2 s``, ``35 s``, ``3m 20s``, ``2h 5m``."""
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    return f"{whole // 3600}h {whole % 3600 // 60}m"


#: The wait chart's lines: quantile, colour, words.
WAIT_LINES = (
    (0.5, "#00695c", "p50"),
    (0.95, "#d84315", "p95"),
)


@dataclass
class WaitChart:
    """Wait time (dispatch to start) per minute, p50 and p95, on a log scale."""

    width: int
    height: int
    #: One polyline per line and run of minutes that had waits: ``{"points", "stroke", "words"}``.
    lines: list[dict[str, Any]] = field(default_factory=list)
    dots: list[dict[str, Any]] = field(default_factory=list)
    #: Horizontal rules at each decade the chart spans: ``{"y", "text"}``.
    grid: list[dict[str, Any]] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)
    #: Whether any minute had a wait to show.
    empty: bool = True


def build_wait_chart(minutes: list[MinuteCounts], width: int = 600, height: int = 110) -> WaitChart:
    """Lines: the fleet's p50 and p95 wait of first attempts, per minute (log scale)."""
    chart = WaitChart(width=width, height=height)
    per_minute = []
    for row in minutes:
        buckets = row.wait_buckets()
        per_minute.append((row, sum(buckets.values()), [wait_percentile(buckets, q) for q, _, _ in WAIT_LINES]))
    values = [v for _, _, found in per_minute for v in found if v is not None]
    slot = width / max(len(minutes), 1)
    for index, (row, _, _) in enumerate(per_minute):
        if index % 10 == 0 or index == len(minutes) - 1:
            stamp = datetime.datetime.fromtimestamp(row.minute, tz=datetime.timezone.utc).strftime("%H:%M")
            chart.labels.append(_label(index, len(minutes), round(index * slot + slot / 2, 1), width, stamp))
    if not values:
        return chart
    chart.empty = False
    # Whole decades around what is shown, a millisecond at least: 1 ms .. 10 s, say.
    low = math.floor(math.log10(max(min(values), 0.001)))
    high = max(math.ceil(math.log10(max(max(values), 0.001))), low + 1)
    top, base = 14.0, float(height - 14)

    def y(seconds: float) -> float:
        place = (math.log10(max(seconds, 10.0**low)) - low) / (high - low)
        return round(base - place * (base - top), 1)

    for decade in range(low, high + 1):
        seconds = 10.0**decade
        text = f"{seconds * 1000:.0f} ms" if decade < 0 else f"{seconds:.0f} s"
        chart.grid.append({"y": y(seconds), "text": text})
    for line, (_, stroke, words) in enumerate(WAIT_LINES):
        run: list[str] = []
        for index, (row, count, found) in enumerate(per_minute):
            value = found[line]
            if value is None:
                if run:
                    chart.lines.append({"points": " ".join(run), "stroke": stroke, "words": words})
                run = []
                continue
            x, at = round(index * slot + slot / 2, 1), y(value)
            run.append(f"{x},{at}")
            stamp = datetime.datetime.fromtimestamp(row.minute, tz=datetime.timezone.utc).strftime("%H:%M")
            title = f"{stamp} UTC: {words} wait {duration(value)} ({count} first attempts started)"
            chart.dots.append({"x": x, "y": at, "fill": stroke, "title": title})
        if run:
            chart.lines.append({"points": " ".join(run), "stroke": stroke, "words": words})
    return chart
