"""Attempt scopes: entered around handle in the thread that runs it; one that fails is left out."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import pytest

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.scopes import add_attempt_scope, remove_attempt_scope
from rainier_sync.types import QueuedJob

from . import jobs


def test_a_scope_wraps_each_attempt_in_the_thread_that_runs_it(manager: QueueManager) -> None:
    entered: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def scope(job: QueuedJob) -> Iterator[None]:
        entered.append((job.id, threading.current_thread().name))
        yield
        entered.append(("left", job.id))

    add_attempt_scope(scope)
    add_attempt_scope(scope)  # added once
    try:
        job_id = manager.dispatch(jobs.Record("scoped"))
        assert Worker(manager, options=WorkerOptions(once=True)).run().processed == 1
    finally:
        remove_attempt_scope(scope)
    (started, left) = entered
    assert started[0] == job_id and started[1] != threading.main_thread().name, "entered in a pool thread"
    assert left == ("left", job_id)
    assert jobs.calls == [("record", "scoped")]


def test_a_scope_that_raises_on_entry_is_logged_and_the_attempt_runs(
    manager: QueueManager, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(job: Any) -> Any:
        raise RuntimeError("scope broke")

    add_attempt_scope(broken)
    try:
        manager.dispatch(jobs.Record("anyway"))
        assert Worker(manager, options=WorkerOptions(once=True)).run().processed == 1
    finally:
        remove_attempt_scope(broken)
    assert jobs.calls == [("record", "anyway")]
    assert any("an attempt scope" in r.getMessage() and "raised on entry" in r.getMessage() for r in caplog.records)
