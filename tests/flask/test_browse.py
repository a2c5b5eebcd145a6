"""The dashboard's job pages through Flask's test client (memory driver): a
queue's ready, delayed and reserved jobs, filtered and paged, and one job."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, replace

import pytest

from rainier_sync import QueueManager
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask.browse import PAGE_SIZE, why_not_listed
from rainier_sync.fleet import FleetRecorder

from .apps import Quiet, RecordApp, fleet_app, make_app, put_failed

SCRIPT = "<script>alert('owned')</script>"


def memory(manager: QueueManager) -> MemoryQueue:
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    return driver


def listed_ids(page: str) -> list[str]:
    return [html.unescape(i) for i in re.findall(r'<tr class="listed-job" data-job-id="([^"]+)">', page)]


def test_ready_jobs_are_listed_in_claim_order_fifty_to_a_page() -> None:
    app, manager = make_app(authorize=lambda: True)
    ids = [manager.dispatch(RecordApp(f"n{n}")) for n in range(120)]
    urgent = manager.pending(RecordApp("urgent")).priority(-1).send()  # claimed first
    client = app.test_client()

    first = client.get("/queues/primary/queues/default")
    assert first.status_code == 200
    page = first.get_data(as_text=True)
    assert listed_ids(page) == [urgent, *ids[: PAGE_SIZE - 1]]
    assert "Ready jobs 1&ndash;50 of 121" in page
    assert 'aria-current="page" data-state="ready"' in page
    assert 'rel="next" href="/queues/primary/queues/default?state=ready&amp;page=2"' in page
    assert 'rel="prev"' not in page and "page 1 of 3" in page

    last = client.get("/queues/primary/queues/default?state=ready&page=3").get_data(as_text=True)
    assert listed_ids(last) == ids[99:]
    assert "Ready jobs 101&ndash;121 of 121" in last and 'rel="next"' not in last
    assert 'rel="prev" href="/queues/primary/queues/default?state=ready&amp;page=2"' in last
    beyond = client.get("/queues/primary/queues/default?page=9").get_data(as_text=True)
    assert listed_ids(beyond) == [] and 'id="no-jobs"' in beyond and "on page 9" in beyond


def test_the_name_filter_keeps_matching_jobs_ignoring_case_and_stays_on_every_link() -> None:
    app, manager = fleet_app()
    recorded = [manager.dispatch(RecordApp(f"r{n}")) for n in range(3)]
    quiet = [manager.dispatch(Quiet()) for _ in range(PAGE_SIZE + 2)]
    client = app.test_client()
    page = client.get("/queues/primary/queues/default?name=RECORD").get_data(as_text=True)
    assert listed_ids(page) == recorded
    assert 'value="RECORD"' in page and "whose name contains &ldquo;RECORD&rdquo;" in page
    assert "of " not in re.search(r"<caption>(.*?)</caption>", page, re.S).group(1)  # type: ignore[union-attr]
    assert 'href="/queues/primary/queues/default?state=delayed&amp;name=RECORD"' in page
    assert '<label for="name-filter">Job name contains</label>' in page

    second = client.get("/queues/primary/queues/default?name=quiet&page=2").get_data(as_text=True)
    assert listed_ids(second) == quiet[PAGE_SIZE:]
    assert 'rel="prev" href="/queues/primary/queues/default?state=ready&amp;name=quiet&amp;page=1"' in second
    none = client.get("/queues/primary/queues/default?name=%25").get_data(as_text=True)
    assert listed_ids(none) == [] and "No ready job whose name contains &ldquo;%&rdquo;" in none


def test_delayed_jobs_by_due_time_and_reserved_ones_with_the_worker_running_them() -> None:
    from freezegun import freeze_time

    app, manager = fleet_app()
    assert manager.locks is not None
    with freeze_time("2026-05-01 09:30:00"):
        later = manager.dispatch_after(600, RecordApp("later"))
        sooner = manager.dispatch_after(60, RecordApp("sooner"))
        running, claimed = (manager.dispatch(RecordApp(label)) for label in ("running", "claimed ahead"))
        jobs = memory(manager).reserve_many(["default"], 2)
        assert [job.id for job in jobs] == [running, claimed]
        worker = FleetRecorder(
            manager.locks,
            "primary",
            ["default"],
            4,
            report=lambda op, exc: None,
            running=lambda: [(jobs[0], 1777627790.0)],
        )
        worker.refresh()
        client = app.test_client()
        delayed = client.get("/queues/primary/queues/default?state=delayed").get_data(as_text=True)
        reserved = client.get("/queues/primary/queues/default?state=reserved").get_data(as_text=True)
        one = client.get(f"/queues/primary/jobs/{running}").get_data(as_text=True)
        workers = client.get("/queues/workers").get_data(as_text=True)

    assert listed_ids(delayed) == [sooner, later]
    assert "Due (UTC)" in delayed and "2026-05-01 09:31:00 UTC" in delayed
    assert listed_ids(reserved) == [running, claimed]
    rows = dict(re.findall(r'data-job-id="([^"]+)">.*?<td class="worker">(.*?)</td>', reserved, re.S))
    assert f"<code>{worker.id}</code>" in rows[running] and "for 10s" in rows[running]
    assert rows[claimed] == "-", "claimed ahead of the threads: no worker lists it as running"
    assert "2026-05-01 09:30:30 UTC" in reserved  # reserved until: now + the reservation (30 s)
    assert '<dd class="state">reserved</dd>' in one
    assert f'href="/queues/workers#worker-{worker.id}"><code>{worker.id}</code></a>' in one
    assert f'id="worker-{worker.id}"' in workers


def test_a_jobs_page_shows_it_whole_and_escaped() -> None:
    app, manager = make_app(authorize=lambda: True)
    job_id = manager.dispatch_after(120, RecordApp(SCRIPT))
    client = app.test_client()
    response = client.get(f"/queues/primary/jobs/{job_id}")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "<script>" not in page and "&lt;script&gt;alert(" in page
    assert '<dd class="state">delayed</dd>' in page and '<dd class="attempts">0 of 1 started</dd>' in page
    assert 'href="/queues/primary/queues/default?state=delayed">default</a>' in page
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]


def test_a_job_no_longer_stored_is_a_404_that_says_where_it_may_be() -> None:
    app, manager = make_app(authorize=lambda: True)
    put_failed(memory(manager), "gone-wrong")
    client = app.test_client()
    missing = client.get("/queues/primary/jobs/never")
    assert missing.status_code == 404 and 'id="not-stored"' in missing.get_data(as_text=True)
    failed = client.get("/queues/primary/jobs/gone-wrong")
    assert failed.status_code == 404
    assert 'href="/queues/primary/failed/gone-wrong">It is in the failed jobs.</a>' in failed.get_data(as_text=True)
    assert client.get("/queues/nowhere/jobs/x").status_code == 404


def test_awkward_job_ids_and_queue_names_round_trip_through_the_links() -> None:
    app, manager = make_app(authorize=lambda: True)
    driver = memory(manager)
    ids = ["emails/1700000000000-0", "..", "tenant/../emails 50% ?#ü"]
    for job_id in ids:
        queued = manager.build(RecordApp(job_id), queue="tenant/../emails ?#")
        queued.id = job_id
        driver.push(queued)
    client = app.test_client()
    index = client.get("/queues/").get_data(as_text=True)
    (href,) = re.findall(r'<a class="browse" href="([^"]+)"\s+aria-label="jobs of queue tenant/../emails \?#"', index)
    page = client.get(html.unescape(href)).get_data(as_text=True)
    assert sorted(listed_ids(page)) == sorted(ids)
    links = re.findall(r'<td><a href="(/queues/primary/jobs/[^"]+)">', page)
    for job_id, link in zip(listed_ids(page), links, strict=True):
        one = client.get(html.unescape(link))
        assert one.status_code == 200
        assert f"<code>{html.escape(job_id, quote=False)}</code>" in one.get_data(as_text=True)


def test_a_bad_state_is_refused_naming_the_states() -> None:
    app, _ = make_app(authorize=lambda: True)
    response = app.test_client().get("/queues/primary/queues/default?state=done")
    assert response.status_code == 400
    assert "state must be one of ready, delayed, reserved" in response.get_data(as_text=True)


def test_the_job_pages_are_guarded_like_every_other() -> None:
    app, manager = make_app()
    job_id = manager.dispatch(RecordApp("x"))
    client = app.test_client()
    assert client.get("/queues/primary/queues/default").status_code == 403
    assert client.get(f"/queues/primary/jobs/{job_id}").status_code == 403


@dataclass(frozen=True)
class _Driver:
    kind: str
    capabilities: object


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("sqs", "visibility timeout"),
        ("kafka", "read by offset"),
        ("sync", "stores none"),
        ("custom", "does not declare"),
    ],
)
def test_a_driver_that_cannot_list_says_why(kind: str, words: str) -> None:
    unlisted = replace(MemoryQueue.capabilities, listing=False)
    why = why_not_listed(_Driver(kind, unlisted))  # type: ignore[arg-type]
    assert why is not None and words in why
    assert why_not_listed(MemoryQueue()) is None


def test_on_a_driver_that_cannot_list_the_page_shows_counts_and_why() -> None:
    from rainier_sync import Container

    from .apps import registry

    class Unlisted(MemoryQueue):
        capabilities = replace(MemoryQueue.capabilities, listing=False)

    manager = QueueManager({"primary": Unlisted()}, registry=registry(), container=Container())
    app, _ = make_app(authorize=lambda: True, manager=manager)
    job_id = manager.dispatch(RecordApp("x"))
    client = app.test_client()
    page = client.get("/queues/primary/queues/default").get_data(as_text=True)
    assert 'id="counts-only"' in page and "does not declare Capabilities.listing" in page
    assert re.search(r'data-state="ready">Ready\s*<span class="count">1</span>', page)
    assert 'class="filter"' not in page and "listed-job" not in page
    one = client.get(f"/queues/primary/jobs/{job_id}")
    assert one.status_code == 404 and 'id="counts-only"' in one.get_data(as_text=True)
