from __future__ import annotations

from collections.abc import Iterator

import pytest

import rainier_sync

from .apps import SEEN, SEEN_LOCK


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    """Booting from config sets the process-wide manager: put it back after each test."""
    previous = rainier_sync.set_instance(None)
    with SEEN_LOCK:
        SEEN.clear()
    yield
    rainier_sync.set_instance(previous)
