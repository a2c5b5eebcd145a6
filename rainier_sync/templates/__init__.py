"""What ``rainier-sync make:job`` writes: a job module and its test."""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

__all__ = ["JobScaffold", "scaffold"]

_JOB = '''"""The {cls} job."""

from __future__ import annotations

from dataclasses import dataclass

from rainier_sync import Job, JobContext


@dataclass
class {cls}(Job):
    """What {cls} does, in one sentence."""

    # The name on the wire: unique, and never renamed once jobs of this type are queued.
    NAME = "{wire}"
    QUEUE = "{queue}"
    TRIES = 3

    # The dataclass fields are the payload: JSON values only (ids, not objects).

    def handle(self, context: JobContext) -> None:
        """Do the work; services come from ``context.resolve(SomeService)``."""
'''

_TEST = '''"""Tests for the {cls} job."""

from __future__ import annotations

from rainier_sync import Container, JobContext, JobRegistry, QueueManager

from {module} import {cls}


def make_job() -> {cls}:
    return {cls}()


def test_it_registers_under_its_name() -> None:
    assert {cls}.NAME in JobRegistry().with_job({cls})


def test_its_payload_crosses_the_wire() -> None:
    job = make_job()
    assert {cls}.from_payload(job.to_payload()) == job


def test_it_is_dispatched_on_its_queue() -> None:
    queue = QueueManager.fake()
    queue.dispatch(make_job())
    queue.assert_pushed_on({cls}, {cls}.QUEUE)


def test_it_handles_a_job() -> None:
    context = JobContext(Container(), "job-1", {cls}.QUEUE, 1, {cls}.TRIES)
    make_job().handle(context)
'''


@dataclass(frozen=True)
class JobScaffold:
    """The class name, the module's file stem and the wire name of a new job."""

    cls: str
    stem: str
    wire: str


def scaffold(name: str, prefix: str = "app") -> JobScaffold:
    """Names for a job called ``name`` (``SendInvoice`` or ``send_invoice``);
    ValueError when it cannot be a class name."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(f"{name!r} is not a job class name; write it like SendInvoice")
    cls = name if name[0].isupper() else "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", cls)
    stem = "_".join(word.lower() for word in words) or cls.lower()
    if keyword.iskeyword(stem):
        stem += "_job"
    return JobScaffold(cls=cls, stem=stem, wire=f"{prefix}.{'-'.join(word.lower() for word in words)}")


def render_job(job: JobScaffold, queue: str) -> str:
    return _JOB.format(cls=job.cls, wire=job.wire, queue=queue)


def render_test(job: JobScaffold, module: str) -> str:
    return _TEST.format(cls=job.cls, module=module)
