"""The queue's tables: each ``database`` connection on this ``DATABASES`` alias
applies the driver's own migrations (``DatabaseQueue.migrations()``), and the
outbox's table where connections are declared with ``outbox = true``."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def apply(apps: Any, schema_editor: Any) -> None:
    from rainier_sync.django.schema import migrate_alias

    migrate_alias(schema_editor.connection.alias)


class Migration(migrations.Migration):  # type: ignore[misc]
    # The driver's migrations run on its own connection, in transactions of its own.
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(apply, migrations.RunPython.noop, elidable=False)]
