"""Kept for imports: the job pages' views live in :mod:`rainier_sync.dashboard.browse`."""

from ..dashboard.browse import PAGE_SIZE, BrowseView, JobView, browse_view, job_view, why_not_listed

__all__ = ["PAGE_SIZE", "BrowseView", "JobView", "browse_view", "job_view", "why_not_listed"]
