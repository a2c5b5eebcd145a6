"""Django for the tests of this folder only.

Django is configured in this process by the session fixture :func:`django_site`,
which only tests here ask for (and the example project runs in subprocesses of
its own), so no Django settings reach the rest of the suite. The site has three
``DATABASES`` aliases on the real servers (SQLite ``default``, PostgreSQL ``pg``,
MariaDB ``maria``), a queue connection on each, a SQLite ``spare`` that none uses, and two on Redis (one of them
through the outbox, kept in ``default``).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.django.support import mysql_database, postgres_database, use_pymysql

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

@pytest.fixture(scope="session")
def django_site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    import django
    from django.conf import settings

    if settings.configured:
        raise RuntimeError("Django is already configured in this test process")
    use_pymysql()
    tmp = tmp_path_factory.mktemp("django")
    pg = postgres_database(request)
    pg.update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True)
    maria = mysql_database(request)
    maria.update(CONN_MAX_AGE=None)
    redis_url: str = request.getfixturevalue("redis_url")
    prefix = f"rainier-dj-{uuid.uuid4().hex[:8]}:"
    settings.configure(
        DEBUG=False,
        SECRET_KEY=secrets.token_hex(32),
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django.contrib.sessions",
            "rainier_sync.django",
            "tests.django.site",
        ],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp / "site.sqlite3")},
            "pg": pg,
            "maria": maria,
            "spare": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp / "spare.sqlite3")},
        },
        RAINIER_QUEUES={
            "default": "sqlite",
            "connections": {
                "sqlite": {"driver": "database", "alias": "default"},
                "pg": {"driver": "database", "alias": "pg"},
                "maria": {"driver": "database", "alias": "maria"},
                "redis": {"driver": "redis", "url": redis_url, "prefix": prefix},
                "relayed": {"driver": "redis", "url": redis_url, "prefix": prefix + "relayed:", "outbox": True},
            },
        },
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    from rainier_sync.django.hygiene import forked_scope
    from rainier_sync.manager import instance_or_none, set_instance
    from rainier_sync.scopes import remove_attempt_scope

    previous = instance_or_none()
    django.setup()
    # What booting made process-wide is put back: the tests here that use the site
    # get it for their own duration (see _site_in_effect), the rest of the suite never.
    remove_attempt_scope(forked_scope)
    set_instance(previous)
    from django.core.management import call_command

    for alias in ("default", "pg", "maria"):
        call_command("migrate", database=alias, verbosity=0)
    from rainier_sync.django.state import booted_manager

    manager = booted_manager()
    yield {"manager": manager, "redis_prefix": prefix, "tmp": tmp}
    from django.db import connections

    connections.close_all()
    manager.close()


@pytest.fixture(autouse=True)
def _site_in_effect(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test using the site: its manager process-wide and the forked-process
    attempt scope on, as booting left them, and both undone after the test."""
    if "django_site" not in request.fixturenames:
        yield
        return
    from rainier_sync.django.hygiene import forked_scope
    from rainier_sync.manager import set_instance
    from rainier_sync.scopes import add_attempt_scope, remove_attempt_scope

    site = request.getfixturevalue("django_site")
    previous = set_instance(site["manager"])
    add_attempt_scope(forked_scope)
    try:
        yield
    finally:
        remove_attempt_scope(forked_scope)
        set_instance(previous)
