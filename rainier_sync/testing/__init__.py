"""Testing support: a manager that records dispatches instead of performing them
(:meth:`QueueManager.fake() <rainier_sync.QueueManager.fake>`), and the pytest
plugin's ``fake_queue`` fixture."""

from __future__ import annotations

from ..manager import FakeQueueManager
from ..recording import PushedJob, Recording

__all__ = ["FakeQueueManager", "PushedJob", "Recording"]
