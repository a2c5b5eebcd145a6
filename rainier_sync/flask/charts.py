"""Kept for imports: the charts live in :mod:`rainier_sync.dashboard.charts`."""

from ..dashboard.charts import FLEET_SEGMENTS, Chart, WaitChart, build_fleet_chart, build_wait_chart, duration

__all__ = ["Chart", "WaitChart", "build_fleet_chart", "build_wait_chart", "FLEET_SEGMENTS", "duration"]
