"""Jobs of the test site, registered by autodiscovery."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rainier_sync import Job, JobContext, job


def _backend_pid(alias: str) -> int:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if connections[alias].vendor == "postgresql" else "SELECT 1")
        return int(cursor.fetchone()[0])


@dataclass
class WriteNote(Job):
    NAME = "site.write-note"
    text: str
    alias: str = "default"

    def handle(self, context: JobContext) -> None:
        from .models import Note

        Note.objects.using(self.alias).create(text=self.text)


@dataclass
class RecordPid(Job):
    """Writes a note ``"TAG BACKEND-PID PROCESS-ID"`` on this thread's Django
    connection to ``alias`` (PostgreSQL)."""

    NAME = "site.record-pid"
    tag: str
    alias: str = "pg"

    def handle(self, context: JobContext) -> None:
        from .models import Note

        pid = _backend_pid(self.alias)
        Note.objects.using(self.alias).create(text=f"{self.tag} {pid} {os.getpid()}")


@dataclass
class RecordPidInChild(RecordPid):
    """:class:`RecordPid` with a time limit: it runs in a supervised child process."""

    NAME = "site.record-pid-in-child"
    TIMEOUT = 60


@job("site.add-note")
def add_note(text: str) -> None:
    from .models import Note

    Note.objects.create(text=text)


@dataclass
class UniqueNote(Job):
    NAME = "site.unique-note"
    UNIQUE_FOR = 60
    text: str

    def unique_id(self) -> str | None:
        return self.text

    def handle(self, context: JobContext) -> None:
        pass
