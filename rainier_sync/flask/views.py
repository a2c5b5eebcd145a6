"""Kept for imports: what the pages show lives in :mod:`rainier_sync.dashboard.views`."""

from ..dashboard.views import (
    ERROR_CUT,
    ERROR_PREVIEW,
    FAILED_LIST,
    FAILED_SCAN,
    FLEET_MINUTES,
    cut_text,
    queue_names,
)

__all__ = ["ERROR_CUT", "ERROR_PREVIEW", "FAILED_LIST", "FAILED_SCAN", "FLEET_MINUTES", "cut_text", "queue_names"]
