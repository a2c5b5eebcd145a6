"""Testing Django code that dispatches jobs.

``fake_queue()`` swaps the manager Django booted for a fake that records
dispatches (the assertions of :class:`~rainier_sync.testing.FakeQueueManager`)::

    from rainier_sync.django.testing import fake_queue

    with fake_queue() as queue:
        client.post("/orders/", {...})
    queue.assert_pushed(SendReceipt)

A dispatch the real manager would send at ``transaction.on_commit`` (inside
``atomic()``, to a connection other than a ``database`` one with ``alias``)
is recorded at the commit too: in a ``TestCase`` (whose test runs inside a
transaction) wrap it in ``self.captureOnCommitCallbacks(execute=True)``.

Under pytest-django, :func:`fake_queue_fixture` is the ``fake_queue`` fixture:
``from rainier_sync.django.testing import fake_queue_fixture as fake_queue`` in
a ``conftest.py``, or ``pytest_plugins = ["rainier_sync.django.testing"]``,
which registers it under that name.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from ..manager import set_instance
from .dispatching import DjangoFakeQueueManager

__all__ = ["fake_queue", "fake_queue_fixture"]


@contextlib.contextmanager
def fake_queue() -> Iterator[DjangoFakeQueueManager]:
    """A fake manager as the process-wide one (what :func:`rainier_sync.instance`,
    :func:`rainier_sync.dispatch` and :func:`rainier_sync.django.get_manager`
    answer) until the block ends; it knows the booted manager's jobs and
    defers what that manager would defer."""
    from copy import deepcopy

    from .state import booted_manager

    booted = booted_manager()
    plan = deepcopy(getattr(booted, "plan", None)) if booted is not None else None
    registry = booted.registry if booted is not None else None
    fake = DjangoFakeQueueManager(plan=plan, registry=registry)
    previous = set_instance(fake)
    try:
        yield fake
    finally:
        set_instance(previous)


def _fake_queue_fixture() -> Iterator[DjangoFakeQueueManager]:
    """The ``fake_queue`` fixture: :func:`fake_queue` for one test."""
    with fake_queue() as fake:
        yield fake


try:
    import pytest
except ImportError:  # pragma: no cover - only the context manager without pytest
    fake_queue_fixture = _fake_queue_fixture
else:
    fake_queue_fixture = pytest.fixture(name="fake_queue")(_fake_queue_fixture)
