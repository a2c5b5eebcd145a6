"""Django integration: add ``"rainier_sync.django"`` to ``INSTALLED_APPS``.

- boots one manager from the settings (``QUEUE_DRIVER`` and the settings
  beside it, or a ``RAINIER_QUEUES`` section) when Django starts, and makes
  :func:`rainier_sync.instance` answer it (:func:`get_manager` too);
- registers the jobs of each installed app's ``jobs`` module
  (``RAINIER_JOBS = [module, ...]`` lists the modules instead);
- dispatches on the calling thread's Django connection to a ``database``
  connection declared with an ``alias``, so a job commits or rolls back with
  the caller's ``transaction.atomic()``; to any other connection, a dispatch
  inside ``atomic()`` is sent at ``transaction.on_commit`` (or written to the
  outbox where one is configured);
- ``manage.py migrate`` creates the queue's tables; ``manage.py queue ...``
  runs the ``rainier-sync`` commands; ``manage.py check`` reports
  ``rainier-sync check``'s findings;
- :class:`DjangoWorker` runs each attempt between ``close_old_connections()``
  calls, as Django runs a request.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_manager", "DjangoQueueManager", "DjangoWorker", "TasksBackend", "boot"]

_LAZY = {
    "get_manager": ".state",
    "boot": ".conf",
    "DjangoQueueManager": ".dispatching",
    "DjangoWorker": ".hygiene",
    "TasksBackend": ".tasks",
}


def __getattr__(name: str) -> Any:
    """Import on first use, so ``INSTALLED_APPS`` can name this package before
    Django is set up (and ``TasksBackend`` comes from :mod:`.tasks`)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
