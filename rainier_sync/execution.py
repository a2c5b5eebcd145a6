"""Running one attempt of a job, and settling its outcome against a driver.

One piece of code serves the worker, ``MemoryQueue.drain()``, the sync driver
and ``dispatch_now``: an attempt runs (in a thread here, or in a supervised
child process for jobs with a time limit), :meth:`Executor.conclude` decides
what happens next (and runs ``failed()`` after the last attempt), and
:meth:`Executor.apply` performs it on the driver and announces it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from . import _clock, signals
from ._text import LOGGED_ERROR, escaped
from .batch import BatchGuard
from .batch import loader as batch_loader
from .batch import settle as settle_in_batch
from .chain import catch_job, hand_over, next_link
from .drivers.extensions import HandsOver
from .errors import JobCrashedError, JobDefinitionError, PayloadError, UnknownJobError
from .jobs import Job, JobContext
from .once import OnceGuard
from .outcome import (
    ABANDONED,
    DEFERRED,
    FAILED,
    INTERRUPTED,
    PROCESSED,
    RELEASED,
    SKIPPED,
    Completion,
    Outcome,
    decided,
)
from .scopes import attempt_scopes
from .types import ExceptionInfo, FailedJob, QueuedJob, encode

if TYPE_CHECKING:
    from .container import Container
    from .drivers.base import Consumer
    from .pending import Dispatcher
    from .registry import JobRegistry
    from .state.base import LockStore

log = logging.getLogger("rainier_sync")

__all__ = ["Executor", "Outcome", "Completion", "decided", "context_for", "result_key", "check_result"]
__all__ += ["PROCESSED", "RELEASED", "FAILED", "ABANDONED", "INTERRUPTED", "DEFERRED", "SKIPPED"]  # from .outcome


def context_for(container: Container, queued: QueuedJob, stop_requested: threading.Event | None) -> JobContext:
    """The context an attempt of ``queued`` runs with (in a thread or a timeout child)."""
    return JobContext(
        container,
        queued.id,
        queued.queue,
        queued.attempts,
        queued.max_attempts,
        connection=queued.connection,
        name=queued.name,
        stop_requested=stop_requested,
    )


def _no_context(queued: QueuedJob) -> ContextManager[Any]:
    return contextlib.nullcontext()


class Executor:
    """Runs attempts and settles them; shared by every path that runs jobs."""

    def __init__(
        self,
        registry: JobRegistry,
        container: Container,
        *,
        locks: LockStore | None = None,
        sender: Any = None,
        attempt_context: Callable[[QueuedJob], ContextManager[Any]] | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.registry = registry
        self.container = container
        self.locks = locks
        self.sender = sender
        #: Queues a chain's next link or its catch job (the manager).
        self.dispatcher = dispatcher
        #: Wraps every attempt and every failed() call (a Flask app context, say).
        self.attempt_context = attempt_context or _no_context
        #: Set by a worker, whose owning loop settles the batch counts of a round of
        #: finished jobs at once (:func:`rainier_sync.batch.settle_many`): an attempt
        #: then only says what it has to count (:attr:`Completion.batch`).
        self.in_rounds = False
        #: A worker's driver when it stores jobs in the transaction that settles
        #: another (``Capabilities.hands_over``): a chain's next link (or catch job)
        #: bound for it is stored so (:attr:`Completion.follow`), not queued beforehand.
        self.hands_over: Any = None

    # -- running -------------------------------------------------------------
    def build(self, queued: QueuedJob) -> Job:
        """The job object for a queued job; raises UnknownJobError or PayloadError."""
        job_class = self.registry.get(queued.name)
        return job_class.from_payload(queued.payload)

    def context(self, queued: QueuedJob, stop_requested: threading.Event | None = None) -> JobContext:
        context = context_for(self.container, queued, stop_requested)
        if queued.meta and "batch" in queued.meta and self.dispatcher is not None:
            context.batch_loader = batch_loader(self.dispatcher, str(queued.meta["batch"]))
        return context

    def lost(self, queued: QueuedJob) -> Completion | None:
        """Settle a job handed out with its attempts used up, without running it.

        Drivers count an attempt when they hand a job out, so a job reserved again
        after its last attempt's reservation lapsed (its worker died: kill -9, OOM,
        power loss) comes with ``attempts > max_attempts``. It fails here, for every
        driver, as :class:`~rainier_sync.errors.JobCrashedError` (``failed()`` runs,
        the unique lock goes): a job that kills its worker cannot loop forever.
        None when the job still has an attempt to run.
        """
        if queued.attempts <= queued.max_attempts:
            return None
        lapsed = queued.attempts - 1
        error = JobCrashedError(
            f"worker lost during attempt {lapsed} of {queued.max_attempts}: job {queued.name!r} ({queued.id}) "
            "was never settled and its reservation lapsed"
        )
        try:
            job: Job | None = self.build(queued)
        except Exception:  # noqa: BLE001 - unreadable too: failed without failed()
            job = None
        completion = self.conclude(queued, job, error, None, info=ExceptionInfo.from_exception(error), final=True)
        completion.attempt = lapsed
        return completion

    def run(self, queued: QueuedJob, stop_requested: threading.Event | None = None) -> Completion:
        """Run one attempt in this thread and conclude it. Never raises, except
        ``KeyboardInterrupt``/``SystemExit``, which abandon the attempt."""
        lost = self.lost(queued)
        if lost is not None:
            return lost
        context = self.context(queued, stop_requested)
        signals.emit(signals.job_processing, self.sender, job=queued, connection=queued.connection)
        started = _clock.monotonic()
        job: Job | None = None
        error: BaseException | None = None
        interrupted = False
        returned: list[Any] = []
        try:
            with self.attempt_context(queued), attempt_scopes(queued):
                job = self.build(queued)
                chain = self.middleware_chain(queued, job)
                if self.skipped_batch(queued, context):
                    pass
                elif chain:
                    built = job
                    self.through(chain, job, context, lambda: returned.append(built.handle(context)))
                else:
                    returned.append(job.handle(context))
                if returned and job.KEEP_RESULT is not None:
                    check_result(job, returned[0])
        except (KeyboardInterrupt, SystemExit) as exc:
            error, interrupted = exc, True
        except BaseException as exc:  # noqa: BLE001 - any failure fails the attempt, not the worker
            error = exc
        finally:
            self.container.flush_scoped()
        duration = _clock.monotonic() - started
        if interrupted and queued.attempts < queued.max_attempts:
            return Completion(queued, ABANDONED, exception=error, interrupted=True, duration=duration)
        if error is None and context.decision is not None:
            return self.decided(queued, context.decision, duration)
        # An interrupted last attempt fails like any other: releasing it would run it past TRIES, forever.
        completion = self.conclude(queued, job, error, context, duration, value=returned[0] if returned else None)
        completion.interrupted = interrupted
        return completion

    def middleware_chain(self, queued: QueuedJob, job: Job) -> list[Any]:
        """The middleware an attempt runs through: the job's own, after a
        :class:`~rainier_sync.once.OnceGuard` when the job is one copy of work
        that must run once (a schedule's tick, a chain's link)."""
        chain = list(job.middleware())
        meta = queued.meta
        if meta and ("once" in meta or "tick" in meta):
            chain.insert(0, OnceGuard(self.locks, meta))
        return chain

    def skipped_batch(self, queued: QueuedJob, context: JobContext) -> bool:
        """Skip a job of a cancelled batch before anything of it runs; True when skipped."""
        meta = queued.meta
        if not meta or "batch" not in meta:
            return False
        reason = BatchGuard.skip_reason(self.locks, str(meta["batch"]))
        if reason is None:
            return False
        context.skip(reason)
        return True

    def through(self, chain: list[Any], job: Job, context: JobContext, last: Callable[[], None]) -> None:
        """Run ``last`` (the attempt itself) inside ``chain``, outermost first. A
        middleware that defers or skips returns without calling ``call_next``;
        one that keeps state in the lock store is given this executor's."""
        from .middleware import StoreBacked

        for middleware in chain:
            if isinstance(middleware, StoreBacked) and middleware.store is None:
                middleware.store = self.locks

        def step(index: int) -> None:
            if context.decision is not None:
                return  # deferred or skipped on the way in: nothing further runs
            if index == len(chain):
                last()
                return
            middleware = chain[index]
            handle = getattr(middleware, "handle", None)
            if not callable(handle):
                raise JobDefinitionError(
                    f"{type(job).__qualname__}.middleware() returned {middleware!r}, which has no handle(job, context, "
                    "call_next)"
                )
            handle(job, context, lambda: step(index + 1))

        step(0)

    def conclude(
        self,
        queued: QueuedJob,
        job: Job | None,
        error: BaseException | None,
        context: JobContext | None = None,
        duration: float = 0.0,
        info: ExceptionInfo | None = None,
        *,
        final: bool = False,
        value: Any = None,
    ) -> Completion:
        """Decide what an attempt's outcome means: processed, released with a
        backoff, or failed (running ``failed()`` once, after the final attempt)."""
        if error is None and info is None:
            if job is not None and job.KEEP_RESULT is not None:
                self.keep_result(queued, job.KEEP_RESULT, {"status": "processed", "value": value})
            meta = queued.meta
            completion = Completion(queued, PROCESSED, duration=duration)
            if not meta or ("chain" not in meta and "batch" not in meta):
                return completion
            try:  # before the acknowledgement: a crash here runs the job, and this, again
                if "batch" in meta:
                    self._count_in_batch(completion, "processed")
                if "chain" in meta:
                    completion.follow = self._hand_over(next_link(queued))
                return completion
            except Exception as exc:  # noqa: BLE001 - its batch or chain could not be told: try the job again
                log.warning(
                    "job %s (%s): could not settle its batch or chain: %s", escaped(queued.id), escaped(queued.name),
                    escaped(exc),
                )  # fmt: skip
                error = exc
        if info is None:
            assert error is not None
            info = ExceptionInfo.from_exception(error)
        permanent = final or job is None or isinstance(error, (UnknownJobError, PayloadError))
        if not permanent and queued.attempts < queued.max_attempts:
            assert job is not None
            try:
                delay = max(0.0, float(job.backoff(queued.attempts)))
            except Exception:  # noqa: BLE001 - a broken backoff must not lose the job
                log.exception(
                    "%s.backoff() raised; retrying job %s after 1s", type(job).__qualname__, escaped(queued.id)
                )
                delay = 1.0
            return Completion(queued, RELEASED, delay=delay, info=info, exception=error, duration=duration)
        if job is not None:
            try:
                with self.attempt_context(queued), attempt_scopes(queued):
                    job.failed(context or self.context(queued), error if error is not None else Exception(info.error))
            except Exception:  # noqa: BLE001 - failing to handle a failure never kills the worker
                log.exception("%s.failed() raised; ignored", type(job).__qualname__)
        keep = job.KEEP_RESULT if job is not None else getattr(self.registry.find(queued.name), "KEEP_RESULT", None)
        if keep is not None:
            self.keep_result(queued, keep, {"status": "failed", "error": info.error})
        completion = Completion(queued, FAILED, info=info, exception=error, duration=duration)
        if queued.meta and "batch" in queued.meta:
            try:
                self._count_in_batch(completion, "failed")
            except Exception:  # noqa: BLE001 - the job is failed whatever its batch's count says
                log.exception(
                    "job %s (%s): could not count its failure in its batch", escaped(queued.id), escaped(queued.name)
                )
        if queued.meta and "chain" in queued.meta:
            try:
                completion.follow = self._hand_over(catch_job(queued))
            except Exception:  # noqa: BLE001 - the link is failed whatever happens to its catch
                log.exception(
                    "job %s (%s): could not queue the chain's catch job", escaped(queued.id), escaped(queued.name)
                )
        return completion

    def decided(self, queued: QueuedJob, decision: tuple[str, float, str], duration: float = 0.0) -> Completion:
        """The completion of an attempt a middleware deferred or skipped; a skipped
        job of a batch (its batch cancelled, say) counts as skipped."""
        completion = decided(queued, decision, duration)
        if completion.outcome is SKIPPED and queued.meta and "batch" in queued.meta:
            try:
                self._count_in_batch(completion, "skipped")
            except Exception:  # noqa: BLE001 - skipped whatever its batch's count says
                log.exception(
                    "job %s (%s): could not count its skip in its batch", escaped(queued.id), escaped(queued.name)
                )
        return completion

    def _count_in_batch(self, completion: Completion, field: str) -> None:
        """Count a finished job of a batch now, or leave it to the worker's round."""
        if self.in_rounds:
            completion.batch = field
        else:
            settle_in_batch(self.locks, self.dispatcher, completion.job, field)

    def _hand_over(self, found: tuple[str | None, QueuedJob] | None) -> list[QueuedJob] | None:
        """Queue what a chain's link hands over, or return it to store in the
        transaction that settles the link (when that link's worker's driver
        ``hands_over`` and the job is bound for that very driver)."""
        if found is None:
            return None
        connection, job = found
        stage = getattr(self.dispatcher, "stage_queued", None)
        if self.hands_over is None or stage is None or job.unique_key is not None:
            hand_over(self.dispatcher, found)
            return None
        assert self.dispatcher is not None
        if self.dispatcher.connection(connection) is not self.hands_over:
            hand_over(self.dispatcher, found)
            return None
        # Stored once, by the transaction that settles the link: no copy to guard against.
        # A chain's catch keeps its key: a retried link that fails again hands it over again.
        if "chain" in (job.meta or {}):
            job.meta = {k: v for k, v in (job.meta or {}).items() if k not in ("once", "hold")}
        stage(connection, [job])
        return [job]

    def keep_result(self, queued: QueuedJob, seconds: float, record: dict[str, Any]) -> None:
        """Keep a finished job's result in the lock store (``KEEP_RESULT``)."""
        if self.locks is None:
            log.warning(
                "job %s (%s) keeps its result, but there is no lock store for it",
                escaped(queued.id),
                escaped(queued.name),
            )
            return
        try:
            self.locks.put_value(result_key(queued.id), encode(record), seconds)
        except Exception:  # noqa: BLE001 - the job's outcome stands; only its result is lost
            log.exception("job %s (%s): its result could not be kept", escaped(queued.id), escaped(queued.name))

    def run_inline(self, job: QueuedJob, failed_store: Callable[[FailedJob], None] | None = None) -> str:
        """Run ``job`` now, in this thread, through all its attempts without
        sleeping out the backoff (the sync driver, ``dispatch_now``); returns its
        id. A final failure is kept in ``failed_store`` and raised; a deferral
        is waited out in this thread, a skip returns at once."""
        job.attempts = 0
        while True:
            job.attempts += 1
            completion = self.run(job)
            if completion.outcome is ABANDONED:
                assert completion.exception is not None
                raise completion.exception
            self.announce(completion)
            if completion.outcome is PROCESSED or completion.outcome is SKIPPED:
                return job.id
            if completion.outcome is DEFERRED:
                # Nowhere to keep it: wait the deferral out here, then the same try again.
                job.attempts -= 1
                time.sleep(completion.delay)
                continue
            if completion.outcome is FAILED:
                assert completion.info is not None
                if failed_store is not None:
                    failed_store(FailedJob.of(job, completion.info, _clock.now()))
                if completion.exception is not None:
                    raise completion.exception
                raise RuntimeError(completion.info.error)

    # -- settling ----------------------------------------------------------------
    def apply(self, driver: Consumer, completion: Completion) -> None:
        """Perform one completion on the driver, then announce it."""
        if completion.outcome is PROCESSED:
            if completion.follow:
                HandsOver.of(driver).acknowledge_handing_over(completion.job, completion.follow)
            else:
                driver.acknowledge(completion.job)
        elif completion.outcome is INTERRUPTED:
            if driver.capabilities.give_back:
                driver.give_back([completion.job])
            else:  # this driver cannot hand a job back uncounted: the cut-short attempt is spent
                driver.release(completion.job, 0)
        elif completion.outcome is DEFERRED:
            if driver.capabilities.give_back:
                driver.defer(completion.job, completion.delay)
            else:  # this driver cannot put a job back uncounted: the deferral spends the try
                driver.release(completion.job, completion.delay)
        elif completion.outcome is SKIPPED:
            driver.acknowledge(completion.job)
        elif completion.outcome is RELEASED or completion.outcome is ABANDONED:
            driver.release(completion.job, completion.delay)
        else:
            assert completion.info is not None
            if completion.follow:
                HandsOver.of(driver).fail_handing_over(completion.job, completion.info, completion.follow)
            else:
                driver.fail(completion.job, completion.info)
        self.announce(completion)

    def announce(self, completion: Completion) -> None:
        """Release the unique lock where due, log, and send the signals."""
        job = completion.job
        outcome = completion.outcome
        if outcome is PROCESSED:
            self.release_unique(job)
            signals.emit(
                signals.job_processed, self.sender, job=job, connection=job.connection, duration=completion.duration
            )
            return
        if outcome is ABANDONED:
            log.warning("job %s (%s) was interrupted; released for another attempt", escaped(job.id), escaped(job.name))
            return
        if outcome is DEFERRED:
            log.info(
                "job %s (%s) deferred %.3gs: %s", escaped(job.id), escaped(job.name), completion.delay,
                escaped(completion.reason),
            )  # fmt: skip
            signals.emit(
                signals.job_deferred,
                self.sender,
                job=job,
                connection=job.connection,
                delay=completion.delay,
                reason=completion.reason,
            )
            return
        if outcome is SKIPPED:
            self.release_unique(job)
            log.info("job %s (%s) skipped: %s", escaped(job.id), escaped(job.name), escaped(completion.reason))
            signals.emit(signals.job_skipped, self.sender, job=job, connection=job.connection, reason=completion.reason)
            return
        if outcome is INTERRUPTED:
            log.warning(
                "job %s (%s) was interrupted by the worker's stop; handed back without spending attempt %d/%d",
                escaped(job.id),
                escaped(job.name),
                job.attempts,
                job.max_attempts,
            )
            signals.emit(signals.job_interrupted, self.sender, job=job, connection=job.connection)
            return
        info = completion.info
        assert info is not None
        final = outcome is FAILED
        attempt = job.attempts if completion.attempt is None else completion.attempt
        signals.emit(
            signals.job_attempt_failed,
            self.sender,
            job=job,
            connection=job.connection,
            attempt=attempt,
            final_attempt=final,
            error=info.error,
            exception=info,
        )
        if final:
            self.release_unique(job)
            log.error(
                "job %s (%s) failed after %d attempt(s): %s", escaped(job.id), escaped(job.name), attempt,
                escaped(info.error, LOGGED_ERROR),
            )  # fmt: skip
            signals.emit(
                signals.job_failed, self.sender, job=job, connection=job.connection, error=info.error, exception=info
            )
        else:
            log.warning(
                "job %s (%s) attempt %d/%d failed, retrying in %.3gs: %s",
                escaped(job.id),
                escaped(job.name),
                job.attempts,
                job.max_attempts,
                completion.delay,
                escaped(info.error, LOGGED_ERROR),
            )
            signals.emit(
                signals.job_released,
                self.sender,
                job=job,
                connection=job.connection,
                delay=completion.delay,
                error=info.error,
                exception=info,
            )

    def release_unique(self, job: QueuedJob) -> None:
        if job.unique_key is None or job.unique_owner is None or self.locks is None:
            return
        try:
            self.locks.release(job.unique_key, job.unique_owner)
        except Exception as exc:  # noqa: BLE001 - the lock's own expiry is the net
            log.warning("could not release unique lock %s: %s", escaped(job.unique_key), escaped(exc))


def result_key(job_id: str) -> str:
    """Where a job's result is kept in the lock store."""
    return f"result:{job_id}"


def check_result(job: Job, value: Any) -> None:
    """Refuse a return value of a ``KEEP_RESULT`` job that is not JSON, naming its type."""
    try:
        encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{type(job).__qualname__}.handle returned a {type(value).__name__}, which is not JSON "
            f"(KEEP_RESULT keeps JSON only): {exc}"
        ) from None
