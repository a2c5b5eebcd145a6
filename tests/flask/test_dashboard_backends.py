"""The dashboard and the commands against real backends: SQLite, PostgreSQL, Redis."""

from __future__ import annotations

import pathlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from rainier_sync import WorkerOptions
from rainier_sync.flask import FlaskWorker

from .apps import Explode, RecordApp, make_app


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Any]:
    if request.param == "sqlite":
        from rainier_sync.drivers.database import DatabaseQueue

        queue = DatabaseQueue.from_url(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", reservation=30)
        queue.migrate()
        yield queue
        queue.close()
    elif request.param == "postgres":
        from rainier_sync.drivers.database import DatabaseQueue
        from tests.drivers.database.support import postgres_schema_url

        queue = DatabaseQueue.from_url(postgres_schema_url(request), reservation=30)
        queue._backend.execute("TRUNCATE rainier_jobs, rainier_failed_jobs, rainier_locks")
        yield queue
        queue.close()
    else:
        from rainier_sync.drivers import RedisQueue

        prefix = f"rsflask:{uuid.uuid4().hex[:12]}:"
        redis_queue = RedisQueue.from_url(request.getfixturevalue("redis_url"), prefix=prefix, reservation=30)
        yield redis_queue
        keys = list(redis_queue.client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            redis_queue.client.delete(*keys)
        redis_queue.close()


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
