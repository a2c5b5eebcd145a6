"""rainier_sync.django.testing: fake_queue() as a context manager and as a
pytest-django fixture; a dispatch deferred to on_commit is recorded under
captureOnCommitCallbacks(execute=True), and never when rolled back."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROJECT = ROOT / "examples" / "django_app"


class Boom(Exception):
    pass


def test_fake_queue_swaps_the_booted_manager_for_one_block(django_site: dict[str, Any]) -> None:
    import rainier_sync
    from rainier_sync.django import get_manager
    from rainier_sync.django.testing import fake_queue
    from tests.django.site.jobs import WriteNote, add_note

    real = django_site["manager"]
    with fake_queue() as queue:
        assert rainier_sync.instance() is queue and get_manager() is queue
        add_note.dispatch("hello")
        rainier_sync.dispatch(WriteNote("there"))
        queue.assert_pushed(add_note, where=lambda job: job.text == "hello")
        queue.assert_pushed_times(WriteNote, 1)
    assert rainier_sync.instance() is real


def test_a_deferred_dispatch_is_recorded_at_commit(django_site: dict[str, Any]) -> None:
    from django.db import transaction
    from django.test import TestCase

    from rainier_sync.django.testing import fake_queue
    from tests.django.site.jobs import WriteNote

    with fake_queue() as queue, pytest.raises(Boom), transaction.atomic():  # a TestCase's own transaction
        with TestCase.captureOnCommitCallbacks(execute=True) as callbacks:
            queue.pending(WriteNote("at commit")).on_connection("redis").send()
            queue.assert_nothing_pushed()  # not before the commit
        assert len(callbacks) == 1
        queue.assert_pushed(WriteNote, where=lambda job: job.text == "at commit")
        raise Boom()


def test_a_rolled_back_deferred_dispatch_is_never_recorded(django_site: dict[str, Any]) -> None:
    from django.db import transaction

    from rainier_sync.django.testing import fake_queue
    from tests.django.site.jobs import WriteNote

    with fake_queue() as queue:
        with pytest.raises(Boom), transaction.atomic():
            queue.pending(WriteNote("never")).on_connection("redis").send()
            raise Boom()
        queue.assert_nothing_pushed()


def test_a_database_dispatch_is_recorded_at_once(django_site: dict[str, Any]) -> None:
    from django.db import transaction

    from rainier_sync.django.testing import fake_queue
    from tests.django.site.jobs import WriteNote

    with fake_queue() as queue, transaction.atomic():
        queue.dispatch(WriteNote("kept with the transaction"))
        queue.assert_pushed(WriteNote)


PYTEST_DJANGO_TESTS = '''
import pytest
from django.test import TestCase

from orders.jobs import send_receipt
from orders.models import Order

pytest_plugins = ["rainier_sync.django.testing"]


@pytest.mark.django_db
def test_the_view_dispatches_the_receipt(client, fake_queue):
    response = client.post("/orders/", {"item": "tea"}, HTTP_HOST="localhost")
    assert response.status_code == 201
    order = Order.objects.get()
    fake_queue.assert_pushed(send_receipt, where=lambda job: job.order_id == order.pk)


@pytest.mark.django_db
def test_out_of_stock_dispatches_nothing(client, fake_queue):
    response = client.post("/orders/", {"item": "gin", "stock": "0"}, HTTP_HOST="localhost")
    assert response.status_code == 409
    assert not Order.objects.exists()


class ReceiptTests(TestCase):
    def test_a_real_dispatch_in_a_test_case_lands_in_the_test_database(self):
        from django.db import connection

        send_receipt.dispatch(1)  # in the test's transaction, on the test database
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM rainier_jobs")
            assert cursor.fetchone()[0] == 1
'''


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_fixture_under_pytest_django(request: pytest.FixtureRequest, tmp_path: pathlib.Path, engine: str) -> None:
    """Also on PostgreSQL, where the test run's database has another name than the
    settings': the job is written in the test database, on the test's connection."""
    (tmp_path / "test_shop.py").write_text(textwrap.dedent(PYTEST_DJANGO_TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\nDJANGO_SETTINGS_MODULE = shop.settings\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SHOP_", "DJANGO_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(ROOT)])
    env["SHOP_DB_NAME"] = str(tmp_path / "shop.sqlite3")
    if engine == "postgresql":
        from tests.django.support import postgres_database

        entry = postgres_database(request, "pytest-django")
        env.update(SHOP_DATABASE="postgresql", SHOP_DB_NAME=entry["NAME"], SHOP_DB_HOST=entry["HOST"])
        env.update(SHOP_DB_PORT=entry["PORT"], SHOP_DB_USER=entry["USER"], SHOP_DB_PASSWORD=entry["PASSWORD"])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_shop.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
