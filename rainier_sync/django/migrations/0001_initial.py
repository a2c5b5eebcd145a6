"""The queue's tables (``DatabaseQueue.migrations()``: jobs, failed jobs, the
lock store's, the outbox's) in the database ``migrate`` runs on."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def apply(apps: Any, schema_editor: Any) -> None:
    from rainier_sync.django.schema import migrate_alias

    migrate_alias(schema_editor.connection.alias)


class Migration(migrations.Migration):  # type: ignore[misc]
    # The driver's migrations take their own lock and transaction on the connection.
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(apply, migrations.RunPython.noop, elidable=False)]
