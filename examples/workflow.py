"""Chains and results: an invoice goes fetch -> render -> mail, and a quote is read back.

Run it with ``python examples/workflow.py``. Everything runs in this process:
the memory driver, a :class:`~rainier_sync.locks.MemoryLockStore` (a chain and
a kept result both need a lock store; across processes it would be a Redis or
database one) and a worker on a thread.

- Invoice 7's chain runs its three links in order.
- Invoice 8's template is missing: rendering fails twice (``TRIES = 2``), the
  chain stops there, mailing never runs, and the chain's ``catch`` job runs once.
- ``Quote`` keeps its result (``KEEP_RESULT``): the script reads it while the job
  is still pending, then waits for it with ``manager.result(job_id, wait=...)``.
  A quote for a cart that does not exist fails, and its result says why.

See docs/workflows.rst.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore

#: Stands in for a database and a file store: what each link leaves for the next.
INVOICES: dict[int, dict[str, Any]] = {7: {"customer": "ada@example.com"}, 8: {"customer": "grace@example.com"}}
TEMPLATES = {"standard"}
CARTS = {42: [899, 400]}

said: list[str] = []
said_lock = threading.Lock()


def say(line: str) -> None:
    with said_lock:
        said.append(line)


@dataclass
class FetchInvoice(Job):
    NAME = "example.invoice.fetch"

    invoice_id: int

    def handle(self, context: JobContext) -> None:
        INVOICES[self.invoice_id]["lines"] = [("consulting", 120_000), ("travel", 8_500)]
        say(f"invoice {self.invoice_id}: fetched 2 lines")


@dataclass
class RenderPdf(Job):
    NAME = "example.invoice.render"
    TRIES = 2
    BACKOFF = 0.05

    invoice_id: int
    template: str = "standard"

    def handle(self, context: JobContext) -> None:
        if self.template not in TEMPLATES:
            say(f"invoice {self.invoice_id}: render attempt {context.attempt}/{context.max_attempts} failed")
            raise LookupError(f"template {self.template!r} is missing")
        INVOICES[self.invoice_id]["pdf"] = f"invoice-{self.invoice_id}.pdf"
        say(f"invoice {self.invoice_id}: rendered invoice-{self.invoice_id}.pdf")


@dataclass
class MailInvoice(Job):
    NAME = "example.invoice.mail"

    invoice_id: int
    done: ClassVar[threading.Event] = threading.Event()

    def handle(self, context: JobContext) -> None:
        invoice = INVOICES[self.invoice_id]
        say(f"invoice {self.invoice_id}: mailed {invoice['pdf']} to {invoice['customer']}")
        MailInvoice.done.set()


@dataclass
class InvoiceFailed(Job):
    """The chain's ``catch``: queued once when a link fails for good."""

    NAME = "example.invoice.failed"

    invoice_id: int
    done: ClassVar[threading.Event] = threading.Event()

    def handle(self, context: JobContext) -> None:
        say(f"invoice {self.invoice_id}: chain stopped; accounts told to send it by hand")
        InvoiceFailed.done.set()


@dataclass
class Quote(Job):
    NAME = "example.quote"
    KEEP_RESULT = 60

    cart_id: int
    go: ClassVar[threading.Event] = threading.Event()

    def handle(self, context: JobContext) -> dict[str, int]:
        Quote.go.wait(5)  # held back so that the script sees it pending first
        if self.cart_id not in CARTS:
            raise KeyError(f"no cart {self.cart_id}")
        return {"total_cents": sum(CARTS[self.cart_id])}


def main() -> int:
    registry = (
        JobRegistry().with_job(FetchInvoice).with_job(RenderPdf).with_job(MailInvoice).with_job(InvoiceFailed)
        .with_job(Quote)
    )  # fmt: skip
    manager = QueueManager({"main": MemoryQueue()}, registry=registry, container=Container(), locks=MemoryLockStore())
    worker = Worker(manager, options=WorkerOptions(concurrency=2, sleep=0.05))
    worker.start()
    try:
        chain_id = manager.chain([FetchInvoice(7), RenderPdf(7), MailInvoice(7)]).catch(InvoiceFailed(7)).dispatch()
        print(f"chain for invoice 7 dispatched (id of {len(chain_id)} hex digits)")
        ok = MailInvoice.done.wait(5)
        manager.chain([FetchInvoice(8), RenderPdf(8, template="dunning"), MailInvoice(8)]).catch(
            InvoiceFailed(8)
        ).dispatch()
        ok = InvoiceFailed.done.wait(5) and ok
        for line in said:
            print(line)

        job_id = manager.dispatch(Quote(42))
        missing_id = manager.dispatch(Quote(99))
        assert job_id is not None and missing_id is not None
        print(f"quote for cart 42, right after dispatch: {manager.result(job_id).status}")
        Quote.go.set()
        result = manager.result(job_id, wait=5)
        print(f"quote for cart 42, waited for: {result.status} {result.value}")
        missing = manager.result(missing_id, wait=5)
        print(f"quote for cart 99, waited for: {missing.status} ({missing.error})")
        print(f"a job nobody dispatched: {manager.result('0' * 32).status}")
    finally:
        worker.stop(grace=5)
        stats = worker.join(5)
    print(f"processed {stats.processed}, released {stats.released}, failed {stats.failed}")
    return 0 if ok and result.status == "processed" and missing.status == "failed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
