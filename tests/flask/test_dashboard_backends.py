"""The dashboard and the commands against real backends: SQLite, PostgreSQL, Redis."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from rainier_sync import WorkerOptions
from rainier_sync.flask import FlaskWorker

from .apps import Explode, RecordApp, make_app


def counts(client: FlaskClient, queue: str) -> dict[str, str]:
    page = client.get("/queues/").get_data(as_text=True)
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', page, re.S)
    assert row is not None, f"no row for queue {queue}"
    return dict(re.findall(r'<td class="(ready|delayed|reserved|failed)[^"]*">(\d+)</td>', row.group(1)))


@pytest.mark.timeout(60)
def test_counts_retry_and_forget_on_a_real_backend(backend: Any) -> None:
    from rainier_sync import Container, QueueManager

    from .apps import registry

    manager = QueueManager(connections={"main": backend}, registry=registry(), container=Container())
    app, _ = make_app(manager=manager, authorize=lambda: True)
    manager.dispatch(Explode("<script>one</script>"))
    manager.dispatch(Explode("two"))
    assert FlaskWorker(app, options=WorkerOptions(queues=["mail"], once=True)).run().failed == 2
    manager.dispatch(RecordApp("ready-1"))
    manager.dispatch(RecordApp("ready-2"))
    manager.dispatch_after(600, RecordApp("later"))

    client = app.test_client()
    assert counts(client, "default") == {"ready": "2", "delayed": "1", "reserved": "0", "failed": "0"}
    assert counts(client, "mail") == {"ready": "0", "delayed": "0", "reserved": "0", "failed": "2"}
    page = client.get("/queues/").get_data(as_text=True)
    assert "<script>one" not in page and "&lt;script&gt;one" in page
    ids = re.findall(r'<tr class="failed-job" data-job-id="([^"]+)">', page)
    assert len(ids) == 2
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None

    detail = client.get(f"/queues/main/failed/{ids[0]}")
    assert detail.status_code == 200 and "tests.flask.explode" in detail.get_data(as_text=True)

    assert client.post(f"/queues/main/failed/{ids[0]}/retry").status_code == 400
    assert client.post(f"/queues/main/failed/{ids[0]}/retry", data={"csrf_token": token.group(1)}).status_code == 303
    assert counts(client, "mail") == {"ready": "1", "delayed": "0", "reserved": "0", "failed": "1"}
    assert client.post(f"/queues/main/failed/{ids[1]}/forget", data={"csrf_token": token.group(1)}).status_code == 303
    assert counts(client, "mail") == {"ready": "1", "delayed": "0", "reserved": "0", "failed": "0"}

    status = app.test_cli_runner().invoke(args=["queue", "status", "--queue", "default,mail"])
    assert status.exit_code == 0, status.output
    assert re.search(r"^main\s+\w+\s+mail\s+1\s+0\s+0\s+1$", status.output, re.M), status.output


@pytest.mark.timeout(120)
def test_a_failed_job_with_a_10_mb_error_on_a_real_backend(backend: Any) -> None:
    from rainier_sync import Container, QueueManager, Worker

    from .apps import TEN_MB_LINES, Shout, check_a_long_errors_pages, registry

    manager = QueueManager(connections={"main": backend}, registry=registry(), container=Container())
    app, _ = make_app(manager=manager, authorize=lambda: True)
    job_id = manager.dispatch(Shout(TEN_MB_LINES))
    assert Worker(manager, options=WorkerOptions(queues=["mail"], once=True)).run().failed == 1
    (failed,) = backend.failed_jobs(1)
    assert failed.id == job_id and len(failed.error) > 10 * 2**20
    check_a_long_errors_pages(
        app.test_client(), f"/queues/main/failed/{job_id}", failed.error, failed.exception.traceback
    )


@pytest.mark.timeout(60)
def test_an_unreadable_redis_entry_of_a_queue_with_a_slash_is_viewed_retried_and_forgotten(
    redis_url: str,
) -> None:
    """The Redis driver names an unreadable entry after its queue: here the id holds a '/'."""
    import html

    from rainier_sync import Container, QueueManager
    from rainier_sync.drivers import RedisQueue

    from .apps import registry

    prefix = f"rsflask:{uuid.uuid4().hex[:12]}:"
    queue = RedisQueue.from_url(redis_url, prefix=prefix, reservation=30)
    try:
        manager = QueueManager(connections={"main": queue}, registry=registry(), container=Container())
        app, _ = make_app(manager=manager, authorize=lambda: True)
        for n in range(2):
            manager.dispatch_on("emails/eu", Explode(f"unused {n}"))  # makes the queue's stream
            queue.client.xadd(f"{prefix}emails/eu:ready:0", {"j": "{not json", "a": "0"})
        assert len(queue.reserve_many(["emails/eu"], 10)) == 2, "the readable jobs are handed out"
        ids = [failed.id for failed in queue.failed_jobs(10)]
        assert len(ids) == 2 and all("emails/eu" in job_id for job_id in ids), ids

        client = app.test_client()
        page = client.get("/queues/").get_data(as_text=True)
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token is not None
        rows = re.findall(r'<tr class="failed-job" data-job-id="([^"]+)">\s*<td><a href="([^"]+)"', page)
        links = {html.unescape(job_id): html.unescape(href) for job_id, href in rows}
        assert sorted(links) == sorted(ids)
        for job_id, href in links.items():
            detail = client.get(href)
            assert detail.status_code == 200, (job_id, href)
            assert f"<code>{job_id}</code>" in detail.get_data(as_text=True)
        retried, forgotten = ids
        done = client.post(f"{links[retried]}/retry", data={"csrf_token": token.group(1)})
        assert done.status_code == 303 and "notice=retried" in done.headers["Location"]
        done = client.post(f"{links[forgotten]}/forget", data={"csrf_token": token.group(1)})
        assert done.status_code == 303 and "notice=forgotten" in done.headers["Location"]
        assert queue.failed_count() == 0
        assert queue.counts("emails/eu").ready == 1, "the unreadable entry went back as it came"
    finally:
        keys = list(queue.client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            queue.client.delete(*keys)
        queue.close()


@pytest.fixture(params=["sqs", "kafka"])
def unlisted(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """A driver that cannot list its jobs, on its real server, and a lock store when it needs one."""
    if request.param == "sqs":
        from rainier_sync.drivers.sqs import SqsQueue
        from tests.services.moto import REGION, sqs_client_for, unique_queue_name

        endpoint = request.getfixturevalue("sqs_endpoint")
        client = sqs_client_for(endpoint)
        urls = [client.create_queue(QueueName=unique_queue_name(name, False))["QueueUrl"] for name in ("q", "failed")]
        sqs = SqsQueue(
            urls[0], failed_queue_url=urls[1], endpoint=endpoint, region=REGION, key="testing", secret="testing"
        )
        yield sqs, None
        sqs.close()
        for url in urls:
            client.delete_queue(QueueUrl=url)
    else:
        from rainier_sync.drivers import KafkaQueue
        from rainier_sync.locks import RedisLockStore

        tag = uuid.uuid4().hex[:10]
        locks = RedisLockStore.from_url(request.getfixturevalue("redis_url"), prefix=f"rsflask:{tag}:")
        brokers = request.getfixturevalue("kafka_brokers")
        kafka = KafkaQueue(brokers, group=f"t-{tag}", topic_prefix=f"t-{tag}.", locks=locks)
        yield kafka, locks
        kafka.close()
        keys = list(locks._client.scan_iter(match=f"rsflask:{tag}:*", count=1000))
        if keys:
            locks._client.delete(*keys)
        locks.close()


@pytest.mark.timeout(120)
def test_sqs_and_kafka_say_why_their_jobs_are_counted_not_listed(unlisted: tuple[Any, Any]) -> None:
    from rainier_sync import Container, QueueManager

    from .apps import registry

    driver, locks = unlisted
    manager = QueueManager({"primary": driver}, registry=registry(), container=Container(), locks=locks)
    app, _ = make_app(manager=manager, authorize=lambda: True)
    job_id = manager.dispatch(RecordApp("counted"))
    client = app.test_client()
    page = client.get("/queues/primary/queues/default").get_data(as_text=True)
    why = {"sqs": "visibility timeout", "kafka": "read by offset"}[driver.kind]
    assert 'id="counts-only"' in page and why in page, page
    assert re.search(r'data-state="ready">Ready\s*<span class="count">\d+</span>', page)
    assert "listed-job" not in page and 'class="filter"' not in page
    one = client.get(f"/queues/primary/jobs/{job_id}")
    assert one.status_code == 404 and why in one.get_data(as_text=True)


# -- the throughput chart, fleet-wide ------------------------------------------------------------
ROOT = pathlib.Path(__file__).resolve().parents[2]
FLEET_BAR = re.compile(
    r"<rect [^>]*><title>(\d\d:\d\d) UTC: (\d+) processed, (\d+) released for a retry, (\d+) failed, (\d+) deferred"
    r"</title></rect>"
)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def shared_backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[tuple[Any, Any, list[str]]]:
    """A driver and a lock store on a real server, emptied, and the arguments of
    ``tests.flask.fleet_worker`` that reach the same ones from another process."""
    if request.param == "redis":
        from rainier_sync.drivers import RedisQueue
        from rainier_sync.locks import RedisLockStore

        url = request.getfixturevalue("redis_url")
        prefix = f"rsflask:{uuid.uuid4().hex[:12]}:"
        queue = RedisQueue.from_url(url, prefix=prefix, reservation=30)
        locks = RedisLockStore.from_url(url, prefix=prefix + "lock:")
        yield queue, locks, ["redis", url, prefix]
        keys = list(queue.client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            queue.client.delete(*keys)
    else:
        from rainier_sync.drivers.database import DatabaseQueue
        from rainier_sync.locks import DatabaseLockStore

        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
            queue = DatabaseQueue.from_url(url, reservation=30)
            queue.migrate()
        else:
            from tests.drivers.database.support import postgres_schema_url

            url = postgres_schema_url(request)
            queue = DatabaseQueue.from_url(url, reservation=30)
            queue._backend.execute(
                "TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks, rainier_tallies, rainier_tally_members, "
                "rainier_flags, rainier_values"
            )
        locks = DatabaseLockStore.from_url(url)
        yield queue, locks, ["database", url, ""]
    locks.close()
    queue.close()


@pytest.mark.timeout(120)
def test_the_index_charts_what_a_worker_in_another_process_finished(
    shared_backend: tuple[Any, Any, list[str]],
) -> None:
    """The web process runs no worker: the chart is the fleet's, read from the lock store."""
    import datetime

    from freezegun import freeze_time

    from rainier_sync import Container, QueueManager

    from .apps import Quiet, registry

    queue, locks, args = shared_backend
    manager = QueueManager({"main": queue}, registry=registry().with_job(Quiet), container=Container(), locks=locks)
    app, _ = make_app(manager=manager, authorize=lambda: True)
    manager.dispatch_many([Quiet(), Quiet(), Quiet(), Explode("<b>no</b>")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.flask.fleet_worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "1"], done.stdout

    client = app.test_client()
    # Both pages read at one instant, so their minutes are the same.
    with freeze_time(datetime.datetime.now(datetime.timezone.utc)):
        index = client.get("/queues/").get_data(as_text=True)
        workers = client.get("/queues/workers").get_data(as_text=True)
    chart = re.search(r'<svg id="throughput".*?</svg>', index, re.S)
    assert chart is not None, "the index draws no throughput chart"
    minutes = {bar.group(1): tuple(int(n) for n in bar.groups()[1:]) for bar in FLEET_BAR.finditer(chart.group(0))}
    assert [sum(column) for column in zip(*minutes.values(), strict=True)] == [3, 0, 1, 0], minutes
    fleet = re.search(r'<svg id="fleet-throughput".*?</svg>', workers, re.S)
    assert fleet is not None
    bars = re.compile(r"<rect [^>]*>.*?</rect>")
    assert bars.findall(chart.group(0)) == bars.findall(fleet.group(0)), "one chart, drawn from the same counts"
