"""Dispatching inside Django's transactions, on the real servers: a database
connection's job commits or rolls back with the caller's writes on the same
Django connection; a Redis dispatch goes out at on_commit, or not at all."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

CONNECTIONS = {"default": "sqlite", "pg": "pg", "maria": "maria"}


class Boom(Exception):
    pass


#: Each test's own queue name, so what one test left is not counted by another.
QUEUE: list[str] = ["notes"]


def _count(manager: Any, connection: str) -> int:
    return int(manager.connection(connection).size(QUEUE[0]))


@pytest.fixture
def manager(django_site: dict[str, Any]) -> Any:
    QUEUE[0] = f"notes-{uuid.uuid4().hex[:8]}"
    return django_site["manager"]


@pytest.mark.parametrize("alias", sorted(CONNECTIONS))
def test_a_job_commits_with_the_callers_writes(manager: Any, alias: str) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote
    from tests.django.site.models import Note

    connection = CONNECTIONS[alias]
    text = f"kept-{alias}"
    with transaction.atomic(using=alias):
        Note.objects.using(alias).create(text=text)
        job_id = manager.pending(WriteNote(text, alias)).on_connection(connection).on_queue(QUEUE[0]).send()
        assert job_id is not None
    assert Note.objects.using(alias).filter(text=text).count() == 1
    assert _count(manager, connection) == 1


@pytest.mark.parametrize("alias", sorted(CONNECTIONS))
def test_a_rolled_back_transaction_keeps_neither_the_row_nor_the_job(manager: Any, alias: str) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote
    from tests.django.site.models import Note

    connection = CONNECTIONS[alias]
    text = f"dropped-{alias}"
    with pytest.raises(Boom):
        with transaction.atomic(using=alias):
            Note.objects.using(alias).create(text=text)
            manager.pending(WriteNote(text, alias)).on_connection(connection).on_queue(QUEUE[0]).send()
            # The job is in the caller's transaction, on the caller's connection.
            with transaction.get_connection(alias).cursor() as cursor:
                cursor.execute("SELECT COUNT(*) FROM rainier_jobs WHERE queue = %s", [QUEUE[0]])
                assert cursor.fetchone()[0] == 1
            raise Boom()
    assert Note.objects.using(alias).filter(text=text).count() == 0
    assert _count(manager, connection) == 0


@pytest.mark.parametrize("alias", sorted(CONNECTIONS))
def test_a_dispatch_outside_atomic_is_stored_at_once(manager: Any, alias: str) -> None:
    from tests.django.site.jobs import WriteNote

    connection = CONNECTIONS[alias]
    manager.pending(WriteNote("now", alias)).on_connection(connection).on_queue(QUEUE[0]).send()
    assert _count(manager, connection) == 1


def test_a_savepoint_rolled_back_drops_only_its_own_job(manager: Any) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote

    with transaction.atomic(using="pg"):
        manager.pending(WriteNote("outer", "pg")).on_connection("pg").on_queue(QUEUE[0]).send()
        with pytest.raises(Boom), transaction.atomic(using="pg"):
            manager.pending(WriteNote("inner", "pg")).on_connection("pg").on_queue(QUEUE[0]).send()
            raise Boom()
    assert _count(manager, "pg") == 1


def test_redis_dispatch_inside_atomic_goes_out_at_commit(manager: Any) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote

    with transaction.atomic():
        job_id = manager.pending(WriteNote("later")).on_connection("redis").on_queue(QUEUE[0]).send()
        assert isinstance(job_id, str)
        assert _count(manager, "redis") == 0
    assert _count(manager, "redis") == 1


def test_redis_dispatch_in_a_rolled_back_transaction_is_never_sent(manager: Any) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote

    with pytest.raises(Boom), transaction.atomic(using="pg"):
        manager.pending(WriteNote("never")).on_connection("redis").on_queue(QUEUE[0]).send()
        raise Boom()
    assert _count(manager, "redis") == 0


def test_redis_dispatch_waits_for_every_open_transaction(manager: Any) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote

    with transaction.atomic(using="pg"):
        with transaction.atomic(using="maria"):
            manager.pending(WriteNote("both")).on_connection("redis").on_queue(QUEUE[0]).send()
        assert _count(manager, "redis") == 0
    assert _count(manager, "redis") == 1


def test_redis_dispatch_outside_atomic_is_sent_at_once(manager: Any) -> None:
    from tests.django.site.jobs import WriteNote

    manager.pending(WriteNote("now")).on_connection("redis").on_queue(QUEUE[0]).send()
    assert _count(manager, "redis") == 1


def test_module_level_dispatch_answers_the_booted_manager(manager: Any) -> None:
    import rainier_sync
    from rainier_sync.django import get_manager
    from tests.django.site.jobs import WriteNote, add_note

    assert rainier_sync.instance() is manager
    assert get_manager() is manager
    assert "site.add-note" in manager.registry and "site.write-note" in manager.registry
    from django.db import transaction

    with pytest.raises(Boom), transaction.atomic():
        add_note.dispatch("x")
        rainier_sync.dispatch(WriteNote("y"))
        raise Boom()
    assert manager.connection("sqlite").size("default") == 0


def test_an_outbox_connection_writes_in_the_callers_transaction(manager: Any) -> None:
    from django.db import transaction

    from tests.django.site.jobs import WriteNote

    outbox = manager.outbox
    waiting = outbox.size("relayed")
    with pytest.raises(Boom), transaction.atomic():
        manager.pending(WriteNote("never")).on_connection("relayed").on_queue(QUEUE[0]).send()
        assert outbox.size("relayed") == waiting  # its row is in the open transaction only
        raise Boom()
    assert outbox.size("relayed") == waiting
    with transaction.atomic():
        manager.pending(WriteNote("kept")).on_connection("relayed").on_queue(QUEUE[0]).send()
    assert outbox.size("relayed") == waiting + 1
    assert _count(manager, "relayed") == 0  # the relay publishes it


def test_on_commit_off_sends_at_once(django_site: dict[str, Any]) -> None:
    from types import SimpleNamespace

    from django.conf import settings
    from django.db import transaction

    from rainier_sync.django.conf import boot
    from tests.django.site.jobs import WriteNote

    section = {"connections": {"redis": dict(settings.RAINIER_QUEUES["connections"]["redis"])}}
    config = SimpleNamespace(DATABASES=settings.DATABASES, RAINIER_QUEUES=section, RAINIER_ON_COMMIT=False)
    eager = boot(config, discover=False)
    queue = f"eager-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(Boom), transaction.atomic():
            eager.pending(WriteNote("now")).on_queue(queue).send()
            assert eager.connection("redis").size(queue) == 1
            raise Boom()
        assert eager.connection("redis").size(queue) == 1  # sent, whatever the transaction did
    finally:
        eager.close()


def test_importing_rainier_sync_does_not_import_django() -> None:
    import subprocess
    import sys

    code = "import sys, rainier_sync; assert not [m for m in sys.modules if m.split('.')[0] == 'django']"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_unique_duplicate_deferred_to_commit_is_dropped_there(manager: Any) -> None:
    from django.db import transaction

    from tests.django.site.jobs import UniqueNote

    text = f"once-{uuid.uuid4().hex[:8]}"
    with transaction.atomic():
        first = manager.pending(UniqueNote(text)).on_connection("redis").on_queue(QUEUE[0]).send()
        second = manager.pending(UniqueNote(text)).on_connection("redis").on_queue(QUEUE[0]).send()
        assert isinstance(first, str) and isinstance(second, str) and first != second
    assert _count(manager, "redis") == 1
