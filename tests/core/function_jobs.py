"""Function jobs shared by the tests (module level, as a worker finds them)."""

from __future__ import annotations

from typing import Any

from rainier_sync import JobContext, backoff, job
from rainier_sync.middleware import Skip

calls: list[tuple[str, Any]] = []


@job("tests.fn.send-invoice", queue="mail", tries=5)
def send_invoice(invoice_id: int, *, resend: bool = False) -> None:
    """Send invoice ``invoice_id``."""
    calls.append(("send_invoice", (invoice_id, resend)))


@job("tests.fn.build-report", takes_context=True, keep_result=60)
def build_report(context: JobContext, report_id: int) -> dict[str, Any]:
    calls.append(("build_report", (report_id, context.attempt)))
    return {"report": report_id, "attempt": context.attempt}


@job("tests.fn.flaky", tries=3, backoff=backoff.none, takes_context=True)
def flaky(context: JobContext, succeed_on: int) -> None:
    calls.append(("flaky", context.attempt))
    if context.attempt < succeed_on:
        raise OSError(f"attempt {context.attempt} failed")


@job("tests.fn.positional")
def positional(a: int, /, *rest: int, scale: int = 1, **named: int) -> None:
    calls.append(("positional", (a, rest, scale, named)))


@job("tests.fn.skipped", middleware=[Skip.when(lambda job: job.n % 2 == 0)])
def skipped(n: int) -> None:
    calls.append(("skipped", n))


@job("tests.fn.unique", unique_id=lambda job: str(job.account))
def unique(account: int) -> None:
    calls.append(("unique", account))


@job("tests.fn.timed", timeout=30, priority=-3, unique_for=60, keep_result=5)
def timed() -> None:
    """Runs in a timeout child: the tests read its options, not its calls."""
