"""manage.py migrate creates the queue's tables on the aliases the queue uses, and only there."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]


def test_migrate_creates_the_tables_only_where_the_queue_keeps_jobs(django_site: dict[str, Any]) -> None:
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", database="spare", verbosity=0)
    for alias, expected in (("default", True), ("pg", True), ("maria", True), ("spare", False)):
        tables = connections[alias].introspection.table_names()
        assert ("rainier_jobs" in tables) is expected, alias
        assert "django_migrations" in tables
