"""Function jobs (``@job``): built by calling, run by every part a Job class runs in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rainier_sync import (
    Job,
    JobDefinitionError,
    JobRegistry,
    PayloadError,
    QueueManager,
    Worker,
    WorkerOptions,
    job,
    set_instance,
)
from rainier_sync.drivers import MemoryQueue
from rainier_sync.functions import FunctionJob
from rainier_sync.locks import MemoryLockStore

from . import function_jobs as fj


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    fj.calls.clear()
    yield
    fj.calls.clear()


def manager_of(*classes: type[Job]) -> tuple[QueueManager, MemoryQueue]:
    queue = MemoryQueue()
    registry = JobRegistry()
    for cls in classes:
        registry.register(cls)
    return QueueManager({"main": queue}, registry=registry, locks=MemoryLockStore()), queue


def run_once(manager: QueueManager) -> None:
    Worker(manager, options=WorkerOptions(once=True, concurrency=1, queues=["mail", "default"])).run()


def test_calling_builds_a_job_of_the_arguments_given_and_runs_nothing() -> None:
    made = fj.send_invoice(7, resend=True)
    assert isinstance(made, Job) and isinstance(made, FunctionJob) and issubclass(fj.send_invoice, Job)
    assert fj.calls == []
    assert made.to_payload() == {"invoice_id": 7, "resend": True}
    assert fj.send_invoice(7).to_payload() == {"invoice_id": 7}, "a default is the function's, at run time"
    assert (made.invoice_id, made.resend, fj.send_invoice(7).resend) == (7, True, False)
    assert (fj.send_invoice.NAME, fj.send_invoice.QUEUE, fj.send_invoice.TRIES) == ("tests.fn.send-invoice", "mail", 5)
    assert (fj.timed.TIMEOUT, fj.timed.PRIORITY, fj.timed.UNIQUE_FOR, fj.timed.KEEP_RESULT) == (30, -3, 60, 5)
    assert repr(made) == "send_invoice(invoice_id=7, resend=True)"
    assert made == fj.send_invoice(7, resend=True) and made != fj.send_invoice(8, resend=True)
    assert fj.send_invoice.__doc__ == "Send invoice ``invoice_id``."
    with pytest.raises(AttributeError, match="no argument 'nope'"):
        _ = made.nope


def test_arguments_that_do_not_fit_the_signature_are_refused_at_the_call_naming_the_function() -> None:
    with pytest.raises(TypeError, match=r"send_invoice\(\): missing a required argument: 'invoice_id'"):
        fj.send_invoice()
    with pytest.raises(TypeError, match=r"send_invoice\(\): .*'copies'"):
        fj.send_invoice(7, copies=2)
    with pytest.raises(TypeError, match=r"send_invoice\(\): too many positional arguments"):
        fj.send_invoice(7, True)


def test_a_non_json_argument_is_refused_at_the_call_naming_it() -> None:
    with pytest.raises(PayloadError, match="field 'invoice_id' is not JSON-serialisable"):
        fj.send_invoice(object())
    with pytest.raises(PayloadError, match="field 'invoice_id' has the key 1"):
        fj.send_invoice({1: "a"})


def test_the_worker_runs_the_function_with_the_arguments_it_was_given() -> None:
    manager, queue = manager_of(fj.send_invoice, fj.positional)
    manager.dispatch(fj.send_invoice(7, resend=True))
    manager.dispatch(fj.positional(1, 2, 3, scale=4, extra=5))
    run_once(manager)
    assert sorted(fj.calls) == [("positional", (1, (2, 3), 4, {"extra": 5})), ("send_invoice", (7, True))]
    assert queue.failed == []


def test_tries_and_backoff_come_from_the_options_and_the_context_is_passed_first() -> None:
    manager, queue = manager_of(fj.flaky)
    manager.dispatch(fj.flaky(3))
    for _ in range(3):
        run_once(manager)
    assert [c for c in fj.calls if c[0] == "flaky"] == [("flaky", 1), ("flaky", 2), ("flaky", 3)]
    assert queue.failed == []
    manager.dispatch(fj.flaky(9))
    for _ in range(3):
        run_once(manager)
    [failed] = queue.failed
    assert failed.name == "tests.fn.flaky" and "attempt 3 failed" in failed.error


def test_what_the_function_returns_is_its_kept_result() -> None:
    manager, _ = manager_of(fj.build_report)
    job_id = manager.dispatch(fj.build_report(42))
    assert job_id is not None
    run_once(manager)
    result = manager.result(job_id)
    assert (result.status, result.value) == ("processed", {"report": 42, "attempt": 1})


def test_middleware_and_unique_id_options_apply() -> None:
    manager, queue = manager_of(fj.skipped, fj.unique)
    manager.dispatch(fj.skipped(1))
    manager.dispatch(fj.skipped(2))
    first = manager.dispatch(fj.unique(5))
    assert first is not None and manager.dispatch(fj.unique(5)) is None, "the duplicate is dropped"
    run_once(manager)
    assert sorted(fj.calls) == [("skipped", 1), ("unique", 5)]
    assert manager.dispatch(fj.unique(5)) is not None, "its lock went with its success"
    assert queue.failed == []


def test_batches_and_chains_of_function_jobs() -> None:
    manager, _ = manager_of(fj.send_invoice, fj.build_report)
    batch = manager.batch([fj.send_invoice(n) for n in range(3)], name="invoices").dispatch()
    manager.chain([fj.send_invoice(10), fj.build_report(11)]).dispatch()
    for _ in range(3):
        run_once(manager)
    found = manager.find_batch(batch.id)
    assert found is not None and (found.processed, found.failed, found.finished) == (3, 0, True)
    assert fj.calls.index(("send_invoice", (10, False))) < fj.calls.index(("build_report", (11, 1)))


def test_the_fake_asserts_on_a_function_job_and_its_arguments() -> None:
    fake = QueueManager.fake()
    fake.dispatch(fj.send_invoice(7, resend=True))
    fake.assert_pushed(fj.send_invoice, where=lambda j: j.invoice_id == 7 and j.resend)
    fake.assert_pushed_on(fj.send_invoice, "mail")
    fake.assert_not_pushed(fj.send_invoice, where=lambda j: j.invoice_id == 8)
    with pytest.raises(AssertionError):
        fake.assert_pushed(fj.build_report)


def test_call_runs_now_and_dispatch_and_pending_go_through_the_instance() -> None:
    assert fj.build_report.call(3) == {"report": 3, "attempt": 1}
    with pytest.raises(PayloadError):
        fj.send_invoice.call(object())
    fj.calls.clear()
    manager, queue = manager_of(fj.send_invoice)
    set_instance(manager)
    try:
        assert fj.send_invoice.dispatch(1) is not None
        assert fj.send_invoice.pending(2, resend=True).delay(60).send() is not None
    finally:
        set_instance(None)
    assert queue.size() == 2
    run_once(manager)
    assert fj.calls == [("send_invoice", (1, False))], "the delayed one waits"


def test_a_payload_that_no_longer_fits_fails_the_job_naming_it() -> None:
    with pytest.raises(PayloadError, match="takes no 'copies'"):
        fj.send_invoice.from_payload({"invoice_id": 1, "copies": 2})


def _nested_holder() -> type[FunctionJob]:
    def inner() -> None: ...

    return job("tests.fn.inner")(inner)


class _Holder:
    def method(self) -> None: ...


async def _coroutine() -> None: ...


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: job("tests.fn.lambda")(lambda: None), "is a lambda"),
        (_nested_holder, "nested in another function"),
        (lambda: job("tests.fn.method")(_Holder.method), "is a method"),
        (lambda: job("tests.fn.async")(_coroutine), "is async"),
        (lambda: job("tests.fn.class")(_Holder), "not a function"),
        (lambda: job("tests.fn.send-invoice")(_module_level), "already taken by tests.core.function_jobs.send_invoice"),
        (lambda: job("tests.fn.x", retries=3), "unknown option 'retries'"),
        (lambda: job("")(_module_level), "non-empty string name"),
        (lambda: job("tests.fn.y", tries=0)(_module_level), "TRIES must be between 1"),
        (lambda: job("tests.fn.z", takes_context=True)(_module_level), "context as its first positional parameter"),
        (lambda: job("tests.fn.w", middleware=5)(_module_level), "middleware must be a list or a callable"),
    ],
)
def test_what_cannot_be_a_function_job_is_refused_at_decoration(make: object, message: str) -> None:
    with pytest.raises(JobDefinitionError, match=message):
        make()  # type: ignore[operator]


def _module_level() -> None: ...


def test_the_same_function_decorated_again_keeps_its_name() -> None:
    again = job("tests.fn.send-invoice", queue="mail")(fj.send_invoice.__wrapped__)
    assert again.NAME == fj.send_invoice.NAME




def test_the_package_name_job_is_the_decorator_whatever_was_imported_first() -> None:
    import subprocess
    import sys

    code = (
        "import rainier_sync.jobs, rainier_sync.manager\n"
        "from rainier_sync import Job, job\n"
        "import rainier_sync.functions\n"
        "assert job is rainier_sync.functions.job and callable(job), job\n"
        "assert rainier_sync.job is job\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
