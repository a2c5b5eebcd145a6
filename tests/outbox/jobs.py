"""The jobs the outbox tests dispatch."""

from __future__ import annotations

from dataclasses import dataclass

from rainier_sync import Job, JobContext, JobRegistry

ran: list[str] = []


@dataclass
class Note(Job):
    NAME = "outbox.note"

    text: str

    def handle(self, context: JobContext) -> None:
        ran.append(self.text)


@dataclass
class OnlyOne(Job):
    """A unique job: one copy queued, waiting or running at a time."""

    NAME = "outbox.only-one"

    key: str

    def unique_id(self) -> str | None:
        return self.key

    def handle(self, context: JobContext) -> None:
        ran.append(f"only {self.key}")


def registry() -> JobRegistry:
    return JobRegistry().with_job(Note).with_job(OnlyOne)
