"""Django connection hygiene in a worker, on the real PostgreSQL: attempts run
between close_old_connections() calls, so a worker whose persistent Django
connection the server closed between jobs carries on; a timeout child never
speaks on the connection it inherited from the worker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rainier_sync import Worker, WorkerOptions
from tests.support import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

WAIT = 30.0


def _wait_for(tag: str, count: int) -> list[tuple[int, int]]:
    """The (backend pid, process id) the first ``count`` RecordPid jobs tagged ``tag`` saw."""
    from tests.django.site.models import Note

    def seen() -> list[str]:
        return list(
            Note.objects.using("pg").filter(text__startswith=tag + " ").order_by("pk").values_list("text", flat=True)
        )

    wait_until(lambda: len(seen()) >= count, timeout=WAIT, message=f"{count} jobs tagged {tag} ran")
    return [(int(text.split()[1]), int(text.split()[2])) for text in seen()]


def _terminate(postgres_url: str, backend_pid: int) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid,)).fetchone()
        assert row is not None and row[0] is True


@pytest.fixture
def running(django_site: dict[str, Any]) -> Iterator[Any]:
    started: list[Worker] = []

    def start(worker_class: type[Worker]) -> tuple[Worker, str, str]:
        queue = f"hygiene-{uuid.uuid4().hex[:8]}"
        options = WorkerOptions(queues=[queue], concurrency=1, sleep=0.05)
        worker = worker_class(django_site["manager"], options=options, connection="pg")
        worker.start()
        started.append(worker)
        return worker, queue, queue

    yield start
    for worker in started:
        worker.stop()
        worker.join(WAIT)


def _send(manager: Any, job: Any, queue: str) -> None:
    manager.pending(job).on_connection("pg").on_queue(queue).send()


def test_a_worker_survives_the_database_closing_its_idle_connection(
    django_site: dict[str, Any], running: Any, postgres_url: str
) -> None:
    from rainier_sync.django import DjangoWorker
    from tests.django.site.jobs import RecordPid

    manager = django_site["manager"]
    worker, queue, tag = running(DjangoWorker)
    _send(manager, RecordPid(tag), queue)
    ((first_backend, _),) = _wait_for(tag, 1)
    _terminate(postgres_url, first_backend)  # the server closes the idle persistent connection
    _send(manager, RecordPid(tag), queue)
    assert _wait_for(tag, 2)[1][0] != first_backend
    # and it was the first attempt that ran it: nothing failed
    assert worker.stats.failed == 0 and worker.stats.released == 0


def test_without_the_hygiene_that_job_fails_on_the_dead_connection(
    django_site: dict[str, Any], running: Any, postgres_url: str
) -> None:
    """What the test above guards against: a plain Worker keeps the dead connection."""
    from tests.django.site.jobs import RecordPid

    manager = django_site["manager"]
    worker, queue, tag = running(Worker)
    _send(manager, RecordPid(tag), queue)
    ((first_backend, _),) = _wait_for(tag, 1)
    _terminate(postgres_url, first_backend)
    _send(manager, RecordPid(tag), queue)
    wait_until(lambda: worker.stats.failed == 1, timeout=WAIT)


def test_a_timeout_child_opens_its_own_connection(django_site: dict[str, Any], postgres_url: str) -> None:
    """The child of a timed attempt is forked from the worker's owning thread, whose
    Django connection it inherits: it must open its own, and leave that one alone."""
    import threading

    from django.db import connections

    from rainier_sync.django import DjangoWorker
    from tests.django.site.jobs import RecordPidInChild, _backend_pid

    manager = django_site["manager"]
    queue = tag = f"child-{uuid.uuid4().hex[:8]}"
    worker = DjangoWorker(manager, options=WorkerOptions(queues=[queue], concurrency=1, sleep=0.05), connection="pg")
    owner: dict[str, int] = {}

    def own() -> None:
        owner["backend"] = _backend_pid("pg")  # the owning thread holds an open Django connection
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=own, daemon=True)
    thread.start()
    try:
        _send(manager, RecordPidInChild(tag), queue)
        child_backend, _ = _wait_for(tag, 1)[0]
    finally:
        worker.stop()
        thread.join(WAIT)
    assert child_backend != owner["backend"]
    assert worker.stats.failed == 0


def _in_a_thread(fn: Any) -> Any:
    """Run ``fn`` in a thread of its own (its own Django connections); its result."""
    import threading

    from django.db import connections

    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(WAIT)
    return result["value"]


def test_a_connection_past_conn_max_age_is_closed_after_the_attempt(django_site: dict[str, Any]) -> None:
    from django.db import connections

    from rainier_sync.django.hygiene import attempt_hygiene

    def attempt() -> bool:
        with attempt_hygiene():
            with connections["default"].cursor() as cursor:  # CONN_MAX_AGE 0, as a request's
                cursor.execute("SELECT 1")
        return connections["default"].connection is None

    assert _in_a_thread(attempt) is True


def test_a_persistent_connection_is_left_alone_without_a_call(django_site: dict[str, Any]) -> None:
    from django.db import connections

    from rainier_sync.django.hygiene import attempt_hygiene

    def attempts() -> tuple[bool, int]:
        conn = connections["maria"]  # CONN_MAX_AGE None, no health checks
        calls: list[int] = []
        original = conn.close_if_unusable_or_obsolete

        def counted() -> None:
            calls.append(1)
            original()

        conn.close_if_unusable_or_obsolete = counted
        opened = []
        for _ in range(3):
            with attempt_hygiene():
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
                opened.append(conn.connection)
        return all(raw is opened[0] for raw in opened), len(calls)

    same, calls = _in_a_thread(attempts)
    assert same and calls == 0


def test_a_connection_an_error_left_unusable_is_closed(django_site: dict[str, Any]) -> None:
    from django.db import OperationalError, connections

    from rainier_sync.django.hygiene import attempt_hygiene

    def attempts() -> bool:
        conn = connections["maria"]
        with conn.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            (connection_id,) = cursor.fetchone()
        import pymysql

        settings = conn.settings_dict
        killer = pymysql.connect(host=settings["HOST"], port=int(settings["PORT"]), user=settings["USER"],
                                 password=settings["PASSWORD"], autocommit=True)  # fmt: skip
        with killer, killer.cursor() as cursor:
            cursor.execute(f"KILL CONNECTION {int(connection_id)}")
        with pytest.raises(OperationalError), attempt_hygiene():
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")
        return conn.connection is None

    assert _in_a_thread(attempts) is True


def test_a_connection_left_out_of_autocommit_is_closed(django_site: dict[str, Any]) -> None:
    from django.db import connections

    from rainier_sync.django.hygiene import attempt_hygiene

    def attempt() -> bool:
        conn = connections["maria"]
        with attempt_hygiene():
            conn.set_autocommit(False)  # a job that forgot to put it back
        return conn.connection is None

    assert _in_a_thread(attempt) is True


def test_debug_resets_the_queries_log_before_each_attempt(django_site: dict[str, Any]) -> None:
    from django.db import connections
    from django.test.utils import override_settings

    from rainier_sync.django.hygiene import attempt_hygiene

    def attempts() -> list[int]:
        conn = connections["maria"]
        sizes = []
        with override_settings(DEBUG=True):
            with conn.cursor() as cursor:  # opened and used before: its queries are logged
                cursor.execute("SELECT 1")
            assert len(conn.queries_log) >= 1
            for _ in range(2):
                with attempt_hygiene():
                    with conn.cursor() as cursor:
                        cursor.execute("SELECT 1")
                    sizes.append(len(conn.queries_log))
        return sizes

    assert _in_a_thread(attempts) == [1, 1]
