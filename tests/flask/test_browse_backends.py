"""The dashboard's job pages on real backends that list their jobs: SQLite, PostgreSQL, Redis."""

from __future__ import annotations

import html
import re
import time
from typing import Any

import pytest

from rainier_sync import Container, QueueManager
from rainier_sync.fleet import FleetRecorder
from rainier_sync.locks import MemoryLockStore

from .apps import Quiet, RecordApp, make_app, registry


def listed(page: str) -> list[str]:
    return [html.unescape(i) for i in re.findall(r'<tr class="listed-job" data-job-id="([^"]+)">', page)]


@pytest.mark.timeout(60)
def test_browsing_a_queue_and_its_jobs_on_a_real_backend(backend: Any) -> None:
    locks = MemoryLockStore()
    manager = QueueManager({"main": backend}, registry=registry().with_job(Quiet), container=Container(), locks=locks)
    app, _ = make_app(manager=manager, authorize=lambda: True)
    ids = [manager.dispatch(RecordApp(f"<b>{n}</b>")) for n in range(55)]
    quiet = manager.dispatch(Quiet())
    later = manager.dispatch_after(600, RecordApp("later"))
    (taken,) = backend.reserve_many(["default"], 1)
    assert taken.id == ids[0]
    worker = FleetRecorder(
        locks, "main", ["default"], 4, report=lambda op, exc: None, running=lambda: [(taken, time.time() - 3)]
    )
    worker.refresh()
    client = app.test_client()

    first = client.get("/queues/main/queues/default").get_data(as_text=True)
    assert listed(first) == ids[1:51]
    assert "Ready jobs 1&ndash;50 of 55" in first and 'rel="next"' in first
    assert "&lt;b&gt;1&lt;/b&gt;" in first and "<b>1</b>" not in first
    second = client.get("/queues/main/queues/default?page=2").get_data(as_text=True)
    assert listed(second) == [*ids[51:], quiet] and 'rel="next"' not in second
    assert listed(client.get("/queues/main/queues/default?name=QUIET").get_data(as_text=True)) == [quiet]
    assert listed(client.get("/queues/main/queues/default?state=delayed").get_data(as_text=True)) == [later]
    reserved = client.get("/queues/main/queues/default?state=reserved").get_data(as_text=True)
    assert listed(reserved) == [taken.id] and f"<code>{worker.id}</code>" in reserved

    one = client.get(f"/queues/main/jobs/{taken.id}")
    assert one.status_code == 200
    page = one.get_data(as_text=True)
    assert '<dd class="state">reserved</dd>' in page and '<dd class="attempts">1 of 1 started</dd>' in page
    assert f"<code>{worker.id}</code></a>" in page and "&#34;label&#34;: &#34;&lt;b&gt;0&lt;/b&gt;&#34;" in page
    assert client.get("/queues/main/jobs/not-a-job").status_code == 404


@pytest.mark.timeout(60)
def test_a_job_id_with_a_slash_opens_from_its_queue_on_a_real_backend(backend: Any) -> None:
    manager = QueueManager({"main": backend}, registry=registry(), container=Container())
    app, _ = make_app(manager=manager, authorize=lambda: True)
    awkward = "tenant/../emails 50% ?#ü"
    job = manager.build(RecordApp("awkward"), queue="emails/eu")
    job.id = awkward
    backend.push(job)
    client = app.test_client()
    index = client.get("/queues/").get_data(as_text=True)
    (href,) = re.findall(r'<a class="browse" href="([^"]+)"\s+aria-label="jobs of queue emails/eu"', index)
    page = client.get(html.unescape(href)).get_data(as_text=True)
    assert listed(page) == [awkward]
    (link,) = re.findall(r'<td><a href="(/queues/main/jobs/[^"]+)">', page)
    one = client.get(html.unescape(link))
    assert one.status_code == 200 and f"<code>{html.escape(awkward, quote=False)}</code>" in one.get_data(as_text=True)


@pytest.mark.timeout(60)
def test_a_name_filter_that_stopped_at_its_bound_says_so(backend: Any) -> None:
    if backend.kind == "memory" or not hasattr(backend, "listing_scan"):
        pytest.skip(f"{backend.kind} does not bound a name filter")
    backend.listing_scan = 5
    manager = QueueManager({"main": backend}, registry=registry().with_job(Quiet), container=Container())
    app, _ = make_app(manager=manager, authorize=lambda: True)
    manager.dispatch_many([RecordApp(str(n)) for n in range(8)])
    manager.dispatch(Quiet())
    page = app.test_client().get("/queues/main/queues/default?name=quiet").get_data(as_text=True)
    assert listed(page) == []
    assert 'id="filter-bound"' in page and "looked at the first 5 ready jobs only" in page
