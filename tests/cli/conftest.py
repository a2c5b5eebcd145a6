"""Running the command line: in this process through ``main()``, or as a real
``python -m rainier_sync`` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import rainier_sync
from rainier_sync import Container, QueueManager
from rainier_sync.drivers import MemoryQueue

from . import app

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m rainier_sync *args`` from the repository root."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("QUEUE_DRIVER", "RAINIER_APP", "DATABASE_URL")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "rainier_sync", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("QUEUE_DRIVER", "RAINIER_APP", "DATABASE_URL", "QUEUE_CONNECTION"):
        monkeypatch.delenv(name, raising=False)
    # queue:work run in this process must not take pytest's SIGINT away.
    monkeypatch.setattr("rainier_sync.worker.Worker.install_signal_handlers", lambda self: None)
    previous = rainier_sync.set_instance(None)
    yield
    rainier_sync.set_instance(previous)
    app.current = None


@pytest.fixture
def memory() -> MemoryQueue:
    """The driver behind ``--app tests.cli.app:current_manager``."""
    driver = MemoryQueue(reservation=30)
    app.current = QueueManager(connections={"main": driver}, registry=app.registry, container=Container())
    return driver


@pytest.fixture
def out_file(tmp_path: Path) -> Path:
    return tmp_path / "jobs.log"
