"""Shared fixtures for the configuration tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pytest

import rainier_sync
from rainier_sync import Job, JobContext, JobRegistry


@dataclass
class Ping(Job):
    NAME = "config-tests.ping"

    n: int = 0

    def handle(self, context: JobContext) -> None:
        context.resolve("seen").append(self.n)


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry().with_job(Ping)


@pytest.fixture(autouse=True)
def _restore_instance() -> Iterator[None]:
    """Booting sets the process-wide manager; put back whatever was there."""
    previous = rainier_sync.set_instance(None)
    yield
    rainier_sync.set_instance(previous)
