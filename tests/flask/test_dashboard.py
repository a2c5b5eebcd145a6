"""The dashboard through Flask's test client: authorisation, CSRF, escaping, counts, actions."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape

from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask import FlaskWorker
from rainier_sync.flask.dashboard import CSRF_SESSION_KEY, ERROR_PREVIEW

from .apps import (
    TEN_MB_LINES,
    Explode,
    Quiet,
    RecordApp,
    Shout,
    check_a_long_errors_pages,
    fail_jobs,
    fleet_app,
    make_app,
    put_failed,
)

SCRIPT = "<script>alert('owned')</script>"


@pytest.fixture
def allowed() -> Iterator[tuple[Flask, QueueManager]]:
    yield make_app(authorize=lambda: True)


def memory(manager: QueueManager) -> MemoryQueue:
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    return driver


def token_of(client: FlaskClient) -> str:
    page = client.get("/queues/").get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, "the page carries no CSRF token"
    return found.group(1)


# -- authorisation ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/queues/", "/queues/static/dashboard.css", "/queues/primary/failed/x"])
def test_every_request_is_refused_until_the_app_gives_an_authorisation_callback(path: str) -> None:
    app, _ = make_app()
    client = app.test_client()
    assert client.get(path).status_code == 403
    assert client.post("/queues/primary/failed/x/retry").status_code == 403


def test_a_callback_saying_no_is_a_403_and_it_sees_the_request() -> None:
    from flask import request

    app, _ = make_app(authorize=lambda: request.headers.get("X-Admin") == "yes")
    client = app.test_client()
    assert client.get("/queues/").status_code == 403
    assert client.get("/queues/", headers={"X-Admin": "no"}).status_code == 403
    assert client.get("/queues/", headers={"X-Admin": "yes"}).status_code == 200


def test_not_mounted_when_dashboard_url_is_none() -> None:
    from rainier_sync.flask import RainierSync

    app = Flask("no_dashboard")
    RainierSync(app, manager=QueueManager(connections={"m": MemoryQueue()}), authorize=lambda: True, dashboard_url=None)
    assert app.test_client().get("/queues/").status_code == 404


# -- what it shows -------------------------------------------------------------------------------
def test_counts_per_connection_and_queue(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    fail_jobs(manager, "first", "second")
    manager.dispatch(RecordApp("ready-1"))
    manager.dispatch(RecordApp("ready-2"))
    manager.dispatch_after(600, RecordApp("later"))
    memory(manager).reserve_many(["default"], 1)
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert 'id="connection-primary"' in page
    row = re.search(r'<tr data-queue="default">(.*?)</tr>', page, re.S)
    assert row is not None
    cells = dict(re.findall(r'<td class="(ready|delayed|reserved|failed)[^"]*">(\d+)</td>', row.group(1)))
    assert cells == {"ready": "1", "delayed": "1", "reserved": "1", "failed": "0"}
    mail = re.search(r'<tr data-queue="mail">(.*?)</tr>', page, re.S)
    assert mail is not None
    assert '<td class="failed">2</td>' in mail.group(1)
    assert page.count('class="failed-job"') == 2
    assert "RuntimeError: first" in page


def test_the_index_charts_a_worker_of_another_manager_that_shares_the_lock_store() -> None:
    """The chart is the fleet's: this worker's manager is not the web's, only its driver and lock store are."""
    from freezegun import freeze_time

    from rainier_sync import Container, Worker

    from .apps import registry

    app, manager = fleet_app()
    elsewhere = QueueManager(
        connections={"primary": memory(manager)},
        registry=registry().with_job(Quiet),
        container=Container(),
        locks=manager.locks,
    )
    with freeze_time("2026-05-01 09:30:00"):
        elsewhere.dispatch_many([Quiet(), Quiet(), Quiet(), Explode("no")])
        Worker(elsewhere, options=WorkerOptions(queues=["default", "mail"], once=True)).run()
        client = app.test_client()
        page = client.get("/queues/").get_data(as_text=True)
        workers = client.get("/queues/workers").get_data(as_text=True)
    svg = re.search(r'<svg id="throughput".*?</svg>', page, re.S)
    assert svg is not None
    assert "09:30 UTC: 3 processed, 0 released for a retry, 1 failed, 0 deferred" in svg.group(0)
    assert "peak 4/min" in svg.group(0)
    fleet = re.search(r'<svg id="fleet-throughput".*?</svg>', workers, re.S)
    assert fleet is not None
    bars = re.compile(r"<rect [^>]*>.*?</rect>")
    assert bars.findall(svg.group(0)) == bars.findall(fleet.group(0))
    assert "Throughput of the whole fleet, last 60 minutes" in page


def test_without_a_lock_store_the_index_says_what_its_chart_needs() -> None:
    from .apps import registry

    app, manager = make_app(
        authorize=lambda: True,
        manager=QueueManager(connections={"primary": MemoryQueue(reservation=30)}, registry=registry(), locks=None),
    )
    manager.dispatch(RecordApp("here"))
    FlaskWorker(app, options=WorkerOptions(once=True)).run()
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert 'id="untracked-throughput"' in page and "locks=" in page
    assert '<svg id="throughput"' not in page, "a worker of this process is not charted on its own"
    assert 'id="connection-primary"' in page


def test_a_lock_store_that_cannot_be_read_leaves_the_rest_of_the_index() -> None:
    app, manager = fleet_app()

    def down(key: str) -> dict[str, int] | None:
        raise ConnectionError("lock store down")

    manager.locks.tally = down  # type: ignore[union-attr, method-assign]
    response = app.test_client().get("/queues/")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "The fleet's counts could not be read from the lock store: ConnectionError: lock store down" in page
    assert 'id="connection-primary"' in page


def test_another_apps_worker_is_not_counted() -> None:
    app, _ = fleet_app()
    other_app, other = fleet_app(name="other")
    other.dispatch(Quiet())
    FlaskWorker(other_app, options=WorkerOptions(once=True)).run()
    assert sum(row.processed for row in other.throughput(minutes=2)) == 1
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert "peak 0/min" in page


def test_nothing_is_fetched_from_elsewhere_and_scripts_are_forbidden(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    fail_jobs(manager, "x")
    response = app.test_client().get("/queues/")
    page = response.get_data(as_text=True)
    assert "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src" not in policy


def test_failed_job_detail_page(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, "detail please")
    page = app.test_client().get(f"/queues/primary/failed/{job_id}")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert "tests.flask.explode" in text
    assert "RuntimeError: detail please" in text
    assert "Traceback (most recent call last)" in text
    assert "&#34;message&#34;: &#34;detail please&#34;" in text
    assert app.test_client().get("/queues/primary/failed/nope").status_code == 404
    assert app.test_client().get(f"/queues/elsewhere/failed/{job_id}").status_code == 404


def test_script_in_a_payload_and_an_error_is_escaped(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, SCRIPT)
    client = app.test_client()
    for path in ("/queues/", f"/queues/primary/failed/{job_id}"):
        text = client.get(path).get_data(as_text=True)
        assert SCRIPT not in text
        assert "<script" not in text
        assert "&lt;script&gt;alert(" in text


# -- actions and CSRF ---------------------------------------------------------------------------------
def test_retry_needs_the_sessions_csrf_token(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, "retry me")
    client = app.test_client()
    token = token_of(client)
    url = f"/queues/primary/failed/{job_id}/retry"

    assert client.post(url).status_code == 400
    assert client.post(url, data={"csrf_token": "forged"}).status_code == 400
    stranger = app.test_client()
    assert stranger.post(url, data={"csrf_token": token}).status_code == 400, "a token from another session"
    assert [f.id for f in memory(manager).failed] == [job_id], "a refused POST changed something"

    done = client.post(url, data={"csrf_token": token})
    assert done.status_code == 303
    assert memory(manager).failed == []
    assert [job.id for job in memory(manager).jobs] == [job_id]
    after = client.get(done.headers["Location"]).get_data(as_text=True)
    assert f"Job {job_id} was queued again." in after
    assert 'class="failed-job"' not in after


def test_forget_with_the_token_in_a_header(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, "forget me")
    client = app.test_client()
    token = token_of(client)
    done = client.post(f"/queues/primary/failed/{job_id}/forget", headers={"X-CSRF-Token": token})
    assert done.status_code == 303
    assert memory(manager).failed == [] and memory(manager).jobs == []
    again = client.post(f"/queues/primary/failed/{job_id}/forget", headers={"X-CSRF-Token": token})
    assert "notice=missing" in again.headers["Location"]


def test_a_session_without_a_token_is_refused_even_with_an_empty_one(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, "x")
    client = app.test_client()
    with client.session_transaction() as session:
        session[CSRF_SESSION_KEY] = ""
    assert client.post(f"/queues/primary/failed/{job_id}/retry", data={"csrf_token": ""}).status_code == 400


def test_an_unreachable_connection_is_reported_not_fatal() -> None:
    class Broken(MemoryQueue):
        def failed_jobs(self, limit: int = 50) -> list:  # type: ignore[type-arg]
            raise ConnectionError("backend down")

    manager = QueueManager(connections={"ok": MemoryQueue(), "down": Broken()}, default="ok")
    app, _ = make_app(manager=manager, authorize=lambda: True)
    response = app.test_client().get("/queues/")
    assert response.status_code == 200
    assert "This connection could not be read: ConnectionError: backend down" in response.get_data(as_text=True)


def test_retry_all_of_a_connection(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    ids = fail_jobs(manager, "a", "b", "c")
    client = app.test_client()
    token = token_of(client)
    assert client.post("/queues/primary/retry-failed").status_code == 400
    assert len(memory(manager).failed) == 3
    done = client.post("/queues/primary/retry-failed", data={"csrf_token": token})
    assert done.status_code == 303
    assert memory(manager).failed == []
    assert sorted(job.id for job in memory(manager).jobs) == sorted(ids)
    assert "3 failed job(s) were queued again." in client.get(done.headers["Location"]).get_data(as_text=True)


def test_retry_of_a_unique_job_a_live_copy_holds_keeps_it_and_says_why() -> None:
    from rainier_sync import Container, JobRegistry
    from rainier_sync.locks import MemoryLockStore

    from .apps import UniqueExplode

    manager = QueueManager(
        connections={"primary": MemoryQueue()},
        registry=JobRegistry().with_job(UniqueExplode),
        container=Container(),
        locks=MemoryLockStore(),
    )
    app, _ = make_app(manager=manager, authorize=lambda: True)
    failed_id = manager.dispatch(UniqueExplode("once"))
    memory(manager).drain()
    live_id = manager.dispatch(UniqueExplode("once"))
    assert failed_id and live_id
    client = app.test_client()
    token = token_of(client)
    done = client.post(f"/queues/primary/failed/{failed_id}/retry", data={"csrf_token": token})
    assert done.status_code == 303
    page = client.get(done.headers["Location"]).get_data(as_text=True)
    assert f"Job {failed_id} was not queued again: it is unique and a copy of it is queued or running now." in page
    assert [f.id for f in memory(manager).failed] == [failed_id]
    assert [j.id for j in memory(manager).jobs] == [live_id]
    client.post("/queues/primary/retry-failed", data={"csrf_token": token})
    assert [f.id for f in memory(manager).failed] == [failed_id], "retry all keeps it too"


# -- job ids that are awkward in a URL -------------------------------------------------------------
#: Ids the dashboard must be able to link to, retry and forget. The Redis driver names an unreadable
#: entry after its queue, which may hold "/"; the rest is whatever a driver or a producer chose.
AWKWARD_IDS = [
    "emails/1700000000000-0",
    "unreadable-tenant/emails-1700000000000-0",
    "50%",
    "%2F",
    "%",
    "with space",
    "what?x=1&y=2",
    "a#b",
    "ünïcødé-日本/ジョブ",
    ".",
    "..",
    "a/../b",
    "./x",
    "/leading",
    "trailing/",
    "a//b",
    "~tilde",
    "back\\slash",
    "tab\tand\nnewline",
    "x/retry",
    "x/forget",
    "retry-failed",
    "",
]


def failed_rows(page: str) -> dict[str, str]:
    """The failed-job rows of a page, by job id."""
    rows = re.findall(r'<tr class="failed-job" data-job-id="([^"]*)">(.*?)</tr>', page, re.S)
    return {html.unescape(job_id): row for job_id, row in rows}


def action_of(row: str, name: str) -> str:
    found = re.search(rf'<form method="post" action="([^"]+/{name})">', row)
    assert found, f"no {name} form in {row}"
    return html.unescape(found.group(1))


def test_every_job_id_round_trips_through_the_pages_links_and_forms(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    driver = memory(manager)
    for job_id in AWKWARD_IDS:
        put_failed(driver, job_id)
    client = app.test_client()
    token = token_of(client)
    rows = failed_rows(client.get("/queues/?limit=500").get_data(as_text=True))
    assert sorted(rows) == sorted(AWKWARD_IDS)
    for number, job_id in enumerate(AWKWARD_IDS):
        row = rows[job_id]
        link = re.search(r'<td><a href="([^"]+)">tests.flask.explode</a>', row)
        assert link, row
        detail = client.get(html.unescape(link.group(1)))
        assert detail.status_code == 200, (job_id, link.group(1))
        text = detail.get_data(as_text=True)
        assert f"<small><code>{html.escape(job_id, quote=False)}</code></small>" in text, job_id
        for form in ("retry", "forget"):
            assert re.search(rf'action="{re.escape(action_of(row, form))}"', html.unescape(text)), (job_id, form)
        if number % 2:
            done = client.post(action_of(row, "retry"), data={"csrf_token": token})
            assert done.status_code == 303, job_id
            assert f"Job {html.escape(job_id, quote=False)} was queued again." in client.get(
                done.headers["Location"]).get_data(as_text=True), job_id
            assert job_id in [job.id for job in driver.jobs]
        else:
            done = client.post(action_of(row, "forget"), data={"csrf_token": token})
            assert done.status_code == 303, job_id
            assert "notice=forgotten" in done.headers["Location"], job_id
        assert job_id not in [failed.id for failed in driver.failed], job_id
    assert driver.failed == []


def test_plain_ids_keep_plain_urls_and_a_mangled_one_is_a_404(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, "plain")
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert f'href="/queues/primary/failed/{job_id}"' in page
    assert f'action="/queues/primary/failed/{job_id}/retry"' in page
    assert app.test_client().get("/queues/primary/failed/~%25%25%25").status_code == 404
    assert app.test_client().get("/queues/primary/failed/~_w").status_code == 404


# -- list pages stay small ---------------------------------------------------------------------------
def test_list_pages_show_a_bounded_preview_of_each_error(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    ids = fail_jobs(manager, *[f"failure {n} " + "x" * 1_000_000 + " THE END" for n in range(8)])
    client = app.test_client()
    page = client.get("/queues/").get_data(as_text=True)
    assert len(page.encode()) < 100_000, f"the page is {len(page.encode()):,} bytes"
    assert "THE END" not in page
    rows = failed_rows(page)
    assert sorted(rows) == sorted(ids)
    for job_id, row in rows.items():
        cell = re.search(r'<td class="error-text">(.*?)</td>', row, re.S)
        assert cell, row
        preview = html.unescape(re.sub(r"<[^>]+>", "", cell.group(1).split("<a ")[0])).strip()
        assert preview.startswith("RuntimeError: failure ") and preview.endswith("…")
        assert len(preview) <= ERROR_PREVIEW
        more = re.search(r'<a [^>]*href="([^"]+)"[^>]*>full error</a>', cell.group(1))
        assert more, cell.group(1)
        detail = client.get(html.unescape(more.group(1)))
        assert detail.status_code == 200
        text = detail.get_data(as_text=True)
        assert text.count("x" * 1_000_000 + " THE END") == 1, "the payload in full; the error cut"
        assert job_id in text


def test_a_failed_jobs_page_shows_a_10_mb_error_once_cut_and_links_the_whole_of_it(
    allowed: tuple[Flask, QueueManager],
) -> None:
    app, manager = allowed
    job_id = manager.dispatch(Shout(TEN_MB_LINES))
    memory(manager).drain()
    (failed,) = memory(manager).failed
    assert len(failed.error) > 10 * 2**20 and failed.exception.traceback.endswith(failed.error + "\n")
    check_a_long_errors_pages(
        app.test_client(), f"/queues/primary/failed/{job_id}", failed.error, failed.exception.traceback
    )


def test_a_failed_jobs_error_and_traceback_as_text_are_guarded_like_every_page() -> None:
    from rainier_sync.flask import get_state

    app, manager = make_app()
    [job_id] = fail_jobs(manager, SCRIPT)
    client = app.test_client()
    for part in ("error", "traceback"):
        assert client.get(f"/queues/primary/failed/{job_id}/{part}").status_code == 403
    get_state(app).authorize = lambda: True
    for part in ("error", "traceback"):
        assert client.get(f"/queues/primary/failed/{job_id}/{part}").status_code == 200
        assert client.get(f"/queues/primary/failed/nope/{part}").status_code == 404
        assert client.post(f"/queues/primary/failed/{job_id}/{part}").status_code in (400, 405)
    put_failed(memory(manager), "told", "RuntimeError: told, never raised")
    assert client.get("/queues/primary/failed/told/error").get_data(as_text=True) == "RuntimeError: told, never raised"
    assert client.get("/queues/primary/failed/told/traceback").status_code == 404, "it has none"
    app.config["SECRET_KEY"] = ""
    assert client.get(f"/queues/primary/failed/{job_id}/error").status_code == 503


def test_a_long_cause_is_clipped_and_the_traceback_holding_it_is_cut(allowed: tuple[Flask, QueueManager]) -> None:
    from rainier_sync.flask.dashboard import ERROR_CUT

    app, manager = allowed
    driver = memory(manager)
    manager.dispatch(Explode("outer"))
    (job,) = driver.reserve_many(["mail"], 1)
    try:
        try:
            raise ValueError("<i>" + "v" * 200_000)
        except ValueError as exc:
            raise RuntimeError("outer") from exc
    except RuntimeError as exc:
        driver.fail(job, exc)
    (failed,) = driver.failed
    client = app.test_client()
    response = client.get(f"/queues/primary/failed/{job.id}")
    assert len(response.data) < 200_000
    page = response.get_data(as_text=True)
    (cause,) = re.findall(r'<ul class="causes">\s*<li><code>ValueError</code>: (.*?)</li>', page, re.S)
    assert html.unescape(cause) == "<i>" + "v" * (ERROR_PREVIEW - 4) + "…"
    assert '<dd class="error-text">RuntimeError: outer</dd>' in page and "whole-error" not in page
    frames = re.search(r'<pre class="traceback">(.*?)</pre>', page, re.S)
    assert frames is not None and len(html.unescape(frames.group(1)).encode()) <= ERROR_CUT
    link = re.search(r'<a class="whole-traceback" href="([^"]+)"', page)
    assert link is not None
    assert client.get(html.unescape(link.group(1))).get_data(as_text=True) == failed.exception.traceback


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("short\nenough", "short\nenough"),
        ("a" * 10 + "\n" + "b" * 100, "a" * 10 + "\n" + "b" * 53),  # the line break is in the first half
        ("a" * 40 + "\n" + "b" * 100, "a" * 40 + "\n"),
        ("é" * 100, "é" * 32),  # bytes of UTF-8, never half a character
        ("€" * 100, "€" * 21),
    ],
)
def test_an_error_is_cut_to_its_first_bytes_after_a_line_break_in_the_second_half(text: str, shown: str) -> None:
    from rainier_sync.flask.views import cut_text

    assert cut_text(text, 64) == (shown, text != shown)


def test_a_short_error_and_its_traceback_are_shown_whole_without_links(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    [job_id] = fail_jobs(manager, SCRIPT)
    page = app.test_client().get(f"/queues/primary/failed/{job_id}").get_data(as_text=True)
    assert f'<dd class="error-text">RuntimeError: {escape(SCRIPT)}</dd>' in page
    assert "whole-error" not in page and "whole-traceback" not in page
    frames = re.search(r'<pre class="traceback">(.*?)</pre>', page, re.S)
    assert frames is not None and "raise RuntimeError(self.message)" in frames.group(1)
    assert "alert(" not in frames.group(1), "the error closing the traceback is the one shown above it"


def test_a_short_error_is_shown_whole_without_a_link(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    fail_jobs(manager, "y" * (ERROR_PREVIEW - len("RuntimeError: ")))
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert "RuntimeError: " + "y" * (ERROR_PREVIEW - len("RuntimeError: ")) + "</td>" in page
    assert "full error" not in page


def test_a_queue_is_paused_and_continued_from_the_dashboard() -> None:
    from rainier_sync import Container
    from rainier_sync.locks import MemoryLockStore

    from .apps import registry

    manager = QueueManager(
        connections={"primary": MemoryQueue()}, registry=registry(), container=Container(), locks=MemoryLockStore()
    )
    app, _ = make_app(manager=manager, authorize=lambda: True)
    fail_jobs(manager, "makes the mail queue show")
    client = app.test_client()
    token = token_of(client)
    url = "/queues/primary/queues/mail/pause"
    assert client.post(url).status_code == 400, "pausing needs the session's CSRF token"
    assert manager.paused("primary") == set()
    done = client.post(url, data={"csrf_token": token})
    assert done.status_code == 303 and manager.paused("primary") == {"mail"}
    page = client.get(done.headers["Location"]).get_data(as_text=True)
    assert "Queue mail is paused" in page and '<span class="paused">paused</span>' in page
    done = client.post("/queues/primary/queues/mail/continue", data={"csrf_token": token})
    assert done.status_code == 303 and manager.paused("primary") == set()


def test_the_schedule_is_listed_with_its_next_run_and_the_tick_last_dispatched() -> None:
    from freezegun import freeze_time

    from rainier_sync import Container, Schedule
    from rainier_sync.locks import MemoryLockStore
    from rainier_sync.scheduler import Scheduler

    from .apps import registry

    class Broken(MemoryLockStore):
        def owner(self, key: str) -> str | None:
            raise ConnectionError("lock store down")

    def manager_with(locks: MemoryLockStore | None) -> QueueManager:
        schedule = (
            Schedule()
            .every(60, RecordApp("tick"), name="minutely")
            .cron("30 2 * * *", RecordApp("night"), name="nightly", tz="Europe/Berlin")
        )
        return QueueManager(
            connections={"primary": MemoryQueue()}, registry=registry(), container=Container(), locks=locks,
            schedule=schedule,
        )

    def rows(page: str) -> dict[str, str]:
        return dict(re.findall(r'<tr data-entry="([^"]+)">(.*?)</tr>', page, re.S))

    manager = manager_with(MemoryLockStore())
    app, _ = make_app(manager=manager, authorize=lambda: True)
    with freeze_time("2026-03-01 12:00:30"):
        scheduler = Scheduler(manager)
        scheduler.run_due()
        sent = {name: job_id for name, _, job_id in scheduler.dispatched}
        page = app.test_client().get("/queues/").get_data(as_text=True)
    assert 'id="schedule"' in page and "<th>Last dispatched</th>" in page
    minutely, nightly = rows(page)["minutely"], rows(page)["nightly"]
    assert '<td class="when">every 60s</td>' in minutely
    assert '<td class="next">2026-03-01 12:01:00 UTC</td>' in minutely
    assert f"2026-03-01 12:00:00 UTC<br><code>{sent['minutely']}</code>" in minutely
    assert "cron &#39;30 2 * * *&#39; (Europe/Berlin)" in nightly
    assert '<td class="next">2026-03-02 01:30:00 UTC</td>' in nightly, "02:30 in Berlin is 01:30 UTC in March"
    assert f"2026-03-01 01:30:00 UTC<br><code>{sent['nightly']}</code>" in nightly

    broken = manager_with(Broken())
    app, _ = make_app(manager=broken, authorize=lambda: True)
    response = app.test_client().get("/queues/")
    page = response.get_data(as_text=True)
    assert response.status_code == 200, "a lock store that cannot be read does not take the page down"
    assert "could not be read from the lock store: ConnectionError: lock store down" in page
    assert '<td class="last">unknown</td>' in rows(page)["minutely"]
    assert 'id="connection-primary"' in page

    app, _ = make_app(manager=manager_with(None), authorize=lambda: True)
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert "nightly" in page and "<th>Last dispatched</th>" not in page, "without a lock store nothing is dispatched"

    app, _ = make_app(authorize=lambda: True)
    assert 'id="schedule"' not in app.test_client().get("/queues/").get_data(as_text=True)


# -- batches -------------------------------------------------------------------------------------
def batch_manager() -> QueueManager:
    from rainier_sync import Container
    from rainier_sync.locks import MemoryLockStore

    from .apps import registry

    return QueueManager(
        connections={"primary": MemoryQueue()}, registry=registry(), container=Container(), locks=MemoryLockStore()
    )


def batch_rows(page: str) -> dict[str, str]:
    return dict(re.findall(r'<tr class="batch" data-batch-id="([^"]+)">(.*?)</tr>', page, re.S))


def test_the_batches_page_lists_each_batch_with_its_progress_and_counts() -> None:
    from freezegun import freeze_time

    manager = batch_manager()
    app, _ = make_app(manager=manager, authorize=lambda: True)
    with freeze_time("2026-03-01 12:00:00") as clock:
        done = manager.batch([Explode("bad"), Explode("worse")], name="import <41>").allow_failures().dispatch()
        memory(manager).drain()
        clock.tick(1)
        running = manager.batch([RecordApp(str(n)) for n in range(4)], name="import 42").dispatch()
        FlaskWorker(app, options=WorkerOptions(once=True, max_jobs=1)).run()  # one of the four, counted
        client = app.test_client()
        response = client.get("/queues/batches")
    page = response.get_data(as_text=True)
    assert response.status_code == 200
    assert list(batch_rows(page)) == [running.id, done.id], "newest first"
    row = batch_rows(page)[running.id]
    assert f'<a href="/queues/batches/{running.id}">import 42</a>' in row
    assert "2026-03-01 12:00:01 UTC" in row
    assert re.search(r'<progress class="batch-progress" [^>]*max="4"\s+value="1"', row), row
    cells = dict(re.findall(r'<td class="(total|processed|failed|skipped|pending)[^"]*">(\d+)</td>', row))
    assert cells == {"total": "4", "processed": "1", "failed": "0", "skipped": "0", "pending": "3"}
    assert '<span class="state running">running</span>' in row
    finished = batch_rows(page)[done.id]
    assert "import &lt;41&gt;" in finished and "<41>" not in finished
    assert '<td class="failed">2</td>' in finished and '<span class="state finished">finished</span>' in finished
    assert "style=" not in page and "<script" not in page, "the page works under the dashboard's CSP"
    index = client.get("/queues/").get_data(as_text=True)
    assert '<a href="/queues/batches">Batches</a>' in index, "linked from the navigation"


def test_a_batchs_page_shows_its_counts_and_its_failed_jobs() -> None:
    manager = batch_manager()
    app, _ = make_app(manager=manager, authorize=lambda: True)
    fail_jobs(manager, "not of the batch")
    batch = manager.batch([Explode("row 1 is bad"), Explode("row 2 is bad")], name="import").allow_failures().dispatch()
    memory(manager).drain()
    client = app.test_client()
    page = client.get(f"/queues/batches/{batch.id}").get_data(as_text=True)
    counts = dict(re.findall(r'<dd class="(total|processed|failed|skipped|pending|cancelled)">(\w+)</dd>', page))
    assert counts == {"total": "2", "processed": "0", "failed": "2", "skipped": "0", "pending": "0", "cancelled": "no"}
    assert sorted(html.unescape(row) for row in re.findall(r'<td class="error-text">([^<]*)</td>', page)) == [
        "RuntimeError: row 1 is bad", "RuntimeError: row 2 is bad"]
    for job_id in failed_rows(page):
        assert client.get(f"/queues/primary/failed/{job_id}").status_code == 200
    assert 'id="failures-not-shown"' not in page
    [failed] = [f for f in memory(manager).failed if "row 1" in f.error]
    memory(manager).forget_failed(failed.id)
    page = client.get(f"/queues/batches/{batch.id}").get_data(as_text=True)
    assert len(failed_rows(page)) == 1 and "1 failed job(s) of this batch are not shown" in page
    assert client.get("/queues/batches/no-such-batch").status_code == 404


def test_a_batch_is_cancelled_from_its_page_with_the_csrf_token() -> None:
    manager = batch_manager()
    app, _ = make_app(manager=manager, authorize=lambda: True)
    batch = manager.batch([RecordApp(str(n)) for n in range(3)], name="to cancel").dispatch()
    client = app.test_client()
    page = client.get(f"/queues/batches/{batch.id}").get_data(as_text=True)
    url = f"/queues/batches/{batch.id}/cancel"
    assert f'<form method="post" action="{url}">' in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    assert client.post(url).status_code == 400
    assert app.test_client().post(url, data={"csrf_token": token.group(1)}).status_code == 400, "another session"
    found = manager.find_batch(batch.id)
    assert found is not None and not found.cancelled, "a refused POST changed something"
    done = client.post(url, data={"csrf_token": token.group(1)})
    assert done.status_code == 303
    found = manager.find_batch(batch.id)
    assert found is not None and found.cancelled
    after = client.get(done.headers["Location"]).get_data(as_text=True)
    assert f"Batch {batch.id} was cancelled: its jobs not yet started are skipped." in after
    assert f'action="{url}"' not in after, "no Cancel button on a cancelled batch"
    assert "cancelled, finishing" in after
    with app.app_context():
        stats = FlaskWorker(app, options=WorkerOptions(once=True)).run()
    assert stats.skipped == 3
    row = batch_rows(client.get("/queues/batches").get_data(as_text=True))[batch.id]
    assert '<span class="state cancelled">cancelled</span>' in row and '<td class="skipped">3</td>' in row
    missing = client.post("/queues/batches/no-such-batch/cancel", data={"csrf_token": token.group(1)})
    assert "There is no batch no-such-batch any more" in client.get(missing.headers["Location"]).get_data(as_text=True)


def test_a_batch_that_expired_is_not_listed() -> None:
    from freezegun import freeze_time

    manager = batch_manager()
    app, _ = make_app(manager=manager, authorize=lambda: True)
    client = app.test_client()
    with freeze_time("2026-03-01 12:00:00") as clock:
        kept = manager.batch([RecordApp("kept")], name="kept").dispatch()
        brief = manager.batch([RecordApp("brief")], name="brief").keep_for(60).dispatch()
        assert set(batch_rows(client.get("/queues/batches").get_data(as_text=True))) == {kept.id, brief.id}
        clock.tick(61)
        assert list(batch_rows(client.get("/queues/batches").get_data(as_text=True))) == [kept.id]
        assert client.get(f"/queues/batches/{brief.id}").status_code == 404


def test_without_a_lock_store_the_batches_page_says_batches_need_one() -> None:
    app, _ = make_app(authorize=lambda: True, manager=unstored_manager())
    client = app.test_client()
    for path in ("/queues/batches", "/queues/batches/any"):
        response = client.get(path)
        assert response.status_code == 200
        assert 'id="no-lock-store"' in response.get_data(as_text=True)
        assert "Batches need a lock store" in response.get_data(as_text=True)
    with client.session_transaction() as session:
        session[CSRF_SESSION_KEY] = "token"
    assert client.post("/queues/batches/any/cancel", data={"csrf_token": "token"}).status_code == 404


def test_a_lock_store_that_cannot_be_read_is_reported_on_the_batches_page() -> None:
    from rainier_sync import Container
    from rainier_sync.locks import MemoryLockStore

    from .apps import registry

    class Broken(MemoryLockStore):
        def flags(self, group: str) -> set[str]:
            raise ConnectionError("lock store down")

        def get_value(self, key: str) -> str | None:
            raise ConnectionError("lock store down")

    manager = QueueManager(
        connections={"primary": MemoryQueue()}, registry=registry(), container=Container(), locks=Broken()
    )
    app, _ = make_app(manager=manager, authorize=lambda: True)
    client = app.test_client()
    for path in ("/queues/batches", "/queues/batches/any"):
        response = client.get(path)
        assert response.status_code == 200
        assert "could not be read from the lock store: ConnectionError: lock store down" in response.get_data(
            as_text=True)


# -- the Workers page ---------------------------------------------------------------------------
def test_the_workers_page_lists_the_recorded_workers_and_charts_the_fleet() -> None:
    from freezegun import freeze_time

    from rainier_sync import Worker
    from rainier_sync.fleet import FleetRecorder

    from .apps import RecordApp

    app, manager = fleet_app()
    assert manager.locks is not None
    with freeze_time("2026-05-01 09:30:00") as frozen:
        manager.dispatch_many([Quiet(), Quiet(), Quiet(), Explode("no")])
        Worker(manager, options=WorkerOptions(queues=["default", "mail"], once=True, concurrency=1)).run()
        running = Worker(manager, options=WorkerOptions(queues=["default", "mail"], concurrency=4))
        assert running.fleet is not None
        running.fleet.refresh()
        # A worker elsewhere, running a job whose id needs escaping.
        job = manager.build(RecordApp(SCRIPT))
        job.id = SCRIPT
        elsewhere = FleetRecorder(
            manager.locks, "primary", ["mail"], 2, report=lambda op, exc: None, running=lambda: [(job, 1777627790.0)]
        )
        elsewhere.refresh()
        frozen.tick(5)
        response = app.test_client().get("/queues/workers")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "<script" not in page and "<code>&lt;script&gt;alert(" in page
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    rows = re.findall(r'<tr class="worker" id="worker-[^"]+" data-worker-id="([^"]+)">', page)
    assert sorted(rows) == sorted([running.fleet.id, elsewhere.id])
    assert 'class="workers-total">2<' in page and "default, mail" in page and "5s ago" in page
    assert "RecordApp" not in page and "tests.flask.record-app" in page and "for 15s" in page
    # The chart: three processed and one failed this minute, by queue in the table below it.
    assert "<svg" in page and 'id="fleet-throughput"' in page and "peak 4/min" in page
    assert "09:30 UTC: 3 processed, 0 released for a retry, 1 failed, 0 deferred" in page
    assert re.search(
        r'<tr data-queue="default"><td>default</td><td class="count processed">3</td>'
        r'<td class="count released">0</td><td class="count failed">0</td>',
        page,
    )
    assert re.search(r'<tr data-queue="mail"><td>mail</td><td class="count processed">0</td>', page)
    assert '<td class="count failed">1</td>' in page


def test_the_index_links_to_the_workers_page(allowed: tuple[Flask, QueueManager]) -> None:
    app, _ = allowed
    page = app.test_client().get("/queues/").get_data(as_text=True)
    assert 'href="/queues/workers"' in page


def unstored_manager() -> QueueManager:
    from rainier_sync import Container

    from .apps import registry

    return QueueManager(
        connections={"primary": MemoryQueue(reservation=30)}, registry=registry(), container=Container(), locks=None
    )


def test_the_workers_page_without_a_lock_store_says_what_it_needs() -> None:
    app, _ = make_app(authorize=lambda: True, manager=unstored_manager())
    response = app.test_client().get("/queues/workers")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert 'id="untracked"' in page and "locks=" in page and "<svg" not in page


def test_the_workers_page_of_a_manager_given_no_locks_shows_its_workers(allowed: tuple[Flask, QueueManager]) -> None:
    app, manager = allowed
    assert manager.locks is not None, "the memory queue's own store"
    worker = Worker(manager, options=WorkerOptions(once=True))
    assert worker.fleet is not None
    worker.fleet.refresh()
    page = app.test_client().get("/queues/workers").get_data(as_text=True)
    assert 'id="untracked"' not in page and worker.fleet.id in page


def test_the_workers_page_reports_an_unreachable_lock_store() -> None:
    app, manager = fleet_app()

    def down(group: str) -> set[str]:
        raise ConnectionError("lock store down")

    manager.locks.flags = down  # type: ignore[union-attr, method-assign]
    response = app.test_client().get("/queues/workers")
    assert response.status_code == 200
    assert "The lock store could not be read: ConnectionError: lock store down" in response.get_data(as_text=True)


def test_the_workers_page_is_guarded_like_every_other() -> None:
    app, _ = make_app()
    assert app.test_client().get("/queues/workers").status_code == 403
