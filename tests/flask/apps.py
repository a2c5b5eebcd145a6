"""Jobs and app builders the Flask tests share."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Any, Callable

from flask import Flask, current_app, g

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, _clock
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask import RainierSync
from rainier_sync.types import ExceptionInfo, FailedJob

SEEN: list[dict[str, Any]] = []
SEEN_LOCK = threading.Lock()


@dataclass
class RecordApp(Job):
    """Records what the job saw of Flask while it ran."""

    NAME = "tests.flask.record-app"

    label: str

    def handle(self, context: JobContext) -> None:
        marker = getattr(g, "marker", None)
        g.marker = self.label
        with SEEN_LOCK:
            SEEN.append(
                {
                    "label": self.label,
                    "app": current_app.name,
                    "g_before": marker,
                    "greeting": current_app.config.get("GREETING"),
                    "resolved_app": context.resolve(Flask).name,
                }
            )


@dataclass
class Explode(Job):
    """Always fails, with whatever message it carries."""

    NAME = "tests.flask.explode"
    QUEUE = "mail"

    message: str

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(self.message)


@dataclass
class UniqueExplode(Explode):
    """An :class:`Explode` of which only one per message may be queued."""

    NAME = "tests.flask.unique-explode"

    def unique_id(self) -> str:
        return self.message


def registry() -> JobRegistry:
    return JobRegistry().with_job(RecordApp).with_job(Explode).with_job(TimedReport)


def make_app(
    *,
    name: str = "tests_flask_app",
    authorize: Callable[[], bool] | None = None,
    manager: QueueManager | None = None,
    **config: Any,
) -> tuple[Flask, QueueManager]:
    app = Flask(name)
    app.config.update(SECRET_KEY=secrets.token_hex(32), TESTING=True, **config)
    if manager is None:
        manager = QueueManager(
            connections={"primary": MemoryQueue(reservation=30)}, registry=registry(), container=Container()
        )
    RainierSync(app, manager=manager, authorize=authorize)
    return app, manager


def fail_jobs(manager: QueueManager, *messages: str) -> list[str]:
    """Dispatch an Explode per message and run them to failure; their ids."""
    ids = [manager.dispatch(Explode(message)) for message in messages]
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    driver.drain()
    return [i for i in ids if i is not None]


def put_failed(driver: MemoryQueue, job_id: str, error: str = "RuntimeError: stored") -> None:
    """Put a failed job with this id straight into the memory driver's failed store."""
    driver.failed.append(
        FailedJob(
            id=job_id,
            name="tests.flask.explode",
            queue="mail",
            connection="primary",
            payload={"message": job_id},
            error=error,
            exception=ExceptionInfo.from_message(error),
            failed_at=_clock.now(),
            attempts=1,
            max_attempts=1,
        )
    )


@dataclass
class TimedReport(Job):
    """Runs in a supervised child (it has a time limit) and fails with the app it saw."""

    NAME = "tests.flask.timed-report"
    TIMEOUT = 20

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(f"child saw app {current_app.name}")

    def failed(self, context: JobContext, error: BaseException) -> None:
        with SEEN_LOCK:
            SEEN.append({"label": "failed-hook", "app": current_app.name})


@dataclass
class Quiet(Job):
    """Does nothing."""

    NAME = "tests.flask.quiet"

    def handle(self, context: JobContext) -> None:
        pass


def fleet_app(**config: Any) -> tuple[Flask, QueueManager]:
    """An app whose manager has a lock store: workers record themselves, queues can be paused."""
    from rainier_sync.locks import MemoryLockStore

    manager = QueueManager(
        connections={"primary": MemoryQueue(reservation=30)},
        registry=registry().with_job(Quiet),
        container=Container(),
        locks=MemoryLockStore(),
    )
    return make_app(manager=manager, authorize=lambda: True, **config)
