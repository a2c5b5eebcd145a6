"""Jobs and app builders the Flask tests share."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Any, Callable

from flask import Flask, current_app, g
from flask.testing import FlaskClient

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


def error_line(n: int) -> str:
    """Line ``n`` of a :class:`Shout`'s error: markup first, then a number found nowhere else."""
    return f"<script>alert('owned')</script> & line {n:07d} of the failure\n"


@dataclass
class Shout(Job):
    """Fails with an error of ``lines`` lines (:func:`error_line`), from a small payload."""

    NAME = "tests.flask.shout"
    QUEUE = "mail"

    lines: int

    def handle(self, context: JobContext) -> None:
        raise RuntimeError("".join(error_line(n) for n in range(self.lines)))


def registry() -> JobRegistry:
    return JobRegistry().with_job(RecordApp).with_job(Explode).with_job(TimedReport).with_job(Shout)


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


#: Lines of a :class:`Shout` whose error is over 10 MB.
TEN_MB_LINES = 10 * 2**20 // len(error_line(0)) + 1


def check_a_long_errors_pages(client: FlaskClient, page_url: str, error: str, traceback: str) -> None:
    """A failed job's page with a long error shows it once, cut, escaped, in a page
    under 200 KB, and links its whole error and traceback as text."""
    import html
    import re

    response = client.get(page_url)
    assert response.status_code == 200
    assert len(response.data) < 200_000, f"the page is {len(response.data):,} bytes"
    from rainier_sync.flask.dashboard import ERROR_CUT

    page = response.get_data(as_text=True)
    assert "<script" not in page and "&lt;script&gt;alert(" in page
    cell = re.search(r'<dd class="error-text">(.*?)</dd>', page, re.S)
    assert cell is not None
    shown = html.unescape(cell.group(1))
    assert error.startswith(shown) and shown.endswith("\n"), "cut at a line's end"
    assert ERROR_CUT // 2 < len(shown.encode()) <= ERROR_CUT
    assert page.count(" line 0000000 of") == 1, "the error is on the page once"
    assert page.count("&lt;script&gt;alert(") == shown.count("<script>"), "and nowhere else"
    frames = re.search(r'<pre class="traceback">(.*?)</pre>', page, re.S)
    assert frames is not None and "Traceback (most recent call last)" in frames.group(1)

    for name, whole in (("whole-error", error), ("whole-traceback", traceback)):
        link = re.search(rf'<a [^>]*class="{name}"[^>]*href="([^"]+)"', page) or re.search(
            rf'<a [^>]*href="([^"]+)"[^>]*class="{name}"', page
        )
        assert link is not None, f"no {name} link"
        text = client.get(html.unescape(link.group(1)))
        assert text.status_code == 200
        assert text.mimetype == "text/plain" and text.mimetype_params.get("charset") == "utf-8"
        assert text.get_data(as_text=True) == whole, f"{name}: the whole of it, as it is"
        # Served as it is, and inert: never sniffed as HTML, and sandboxed should a browser render it.
        assert text.headers["X-Content-Type-Options"] == "nosniff"
        policy = text.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "sandbox" in policy
