"""pytest plugin: the ``fake_queue`` fixture."""

from __future__ import annotations

from typing import Iterator

import pytest

from ..manager import set_instance
from . import FakeQueueManager


@pytest.fixture
def fake_queue() -> Iterator[FakeQueueManager]:
    """A :class:`FakeQueueManager` installed as the process-wide manager for one test."""
    fake = FakeQueueManager()
    previous = set_instance(fake)
    try:
        yield fake
    finally:
        set_instance(previous)
