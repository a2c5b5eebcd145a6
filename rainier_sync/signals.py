"""Worker and queue events, as blinker signals.

Connect a receiver: ``job_failed.connect(on_failed)``. Each is sent with the
worker (or the driver) as sender and keyword arguments:

- ``job_dispatching(jobs, connection)``: sent by the manager with the
  :class:`~rainier_sync.types.QueuedJob` list it is about to store; a receiver
  may add to each job's ``meta`` (a trace context), which travels with the job.
- ``job_processing(job, connection)``: before each attempt.
- ``job_processed(job, connection, duration)``: after success.
- ``job_released(job, connection, delay, error, exception)``: returned for another attempt.
- ``job_failed(job, connection, error, exception)``: attempts exhausted.
- ``job_attempt_failed(job, connection, attempt, final_attempt, error, exception)``:
  every failed attempt, released or failed for good (for an error reporter).
- ``job_interrupted(job, connection)``: an attempt the worker's stop cut short
  (its grace ran out), handed back without spending a try.
- ``job_deferred(job, connection, delay, reason)``: a middleware put the job
  back, due in ``delay`` seconds, without spending a try.
- ``job_skipped(job, connection, reason)``: a middleware acknowledged it unrun.
- ``queue_message_discarded(connection, error, exception, raw)``: a message the
  driver could not read.
- ``queue_operation_failed(connection, operation, error, exception)``: an
  acknowledge, release, reserve... that raised.

``error`` is the string the failed store keeps; ``exception`` is an
:class:`~rainier_sync.types.ExceptionInfo` (kind, message, cause chain,
traceback text, ``timed_out``, ``crashed``). A receiver that raises is logged
and never stops the worker or the other receivers.
"""

from __future__ import annotations

import logging
from typing import Any

from blinker import NamedSignal, Namespace

__all__ = [
    "job_dispatching",
    "job_processing",
    "job_processed",
    "job_released",
    "job_failed",
    "job_attempt_failed",
    "job_interrupted",
    "job_deferred",
    "job_skipped",
    "queue_message_discarded",
    "queue_operation_failed",
    "emit",
]

_signals = Namespace()

job_dispatching = _signals.signal("job-dispatching")
job_processing = _signals.signal("job-processing")
job_processed = _signals.signal("job-processed")
job_released = _signals.signal("job-released")
job_failed = _signals.signal("job-failed")
job_attempt_failed = _signals.signal("job-attempt-failed")
job_interrupted = _signals.signal("job-interrupted")
job_deferred = _signals.signal("job-deferred")
job_skipped = _signals.signal("job-skipped")
queue_message_discarded = _signals.signal("queue-message-discarded")
queue_operation_failed = _signals.signal("queue-operation-failed")

log = logging.getLogger("rainier_sync")


def emit(signal: NamedSignal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal``, calling every receiver even when one raises."""
    if not signal.receivers:
        return
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, **kwargs)
        except Exception:  # noqa: BLE001 - a listener must never kill the worker
            log.exception("a receiver of %s raised; ignored", signal.name)


#: The signals of a job's life, dispatch to settlement, in the order they come.
LIFECYCLE = (
    "job_dispatching",
    "job_processing",
    "job_processed",
    "job_released",
    "job_failed",
    "job_deferred",
    "job_skipped",
    "job_interrupted",
)


def lifecycle_receivers(listener: Any) -> list[tuple[NamedSignal, Any]]:
    """``(signal, listener._on_<event>)`` for each signal of :data:`LIFECYCLE`
    (``job_processed`` pairs with ``_on_processed``): what a listener such as
    the metrics or the tracing connects."""
    return [(globals()[name], getattr(listener, "_on_" + name.removeprefix("job_"))) for name in LIFECYCLE]
