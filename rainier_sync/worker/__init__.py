"""The worker: one owning loop talks to the backend, a thread pool runs handlers,
and supervised child processes run attempts that have a time limit.

- :mod:`~rainier_sync.worker.options`: :class:`WorkerOptions`, :class:`WorkerStats`.
- :mod:`~rainier_sync.worker.loop`: :class:`Worker`, the owning loop.
- :mod:`~rainier_sync.worker.health`: :class:`WorkerHealth`, what :meth:`Worker.health` reports.
- :mod:`~rainier_sync.worker.pool`: the threads that run handlers.
- :mod:`~rainier_sync.worker.supervisor` and :mod:`~rainier_sync.worker.child`:
  the child processes that enforce time limits.
"""

from __future__ import annotations

from .health import WorkerHealth as WorkerHealth
from .loop import Worker as Worker
from .options import WorkerOptions as WorkerOptions
from .options import WorkerStats as WorkerStats

__all__ = ["Worker", "WorkerOptions", "WorkerStats", "WorkerHealth"]
