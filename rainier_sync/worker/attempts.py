"""Running attempts: in the pool's thread, or in a supervised child process
when the attempt has a time limit (its job's ``TIMEOUT``, else the worker's)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .. import _clock
from ..execution import ABANDONED, Completion, Executor
from ..fleet import wait_bucket
from ..types import QueuedJob
from .child import load_child_setup, supported
from .options import WorkerOptions
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ..manager import QueueManager
    from ..registry import JobRegistry

__all__ = ["Attempts"]

log = logging.getLogger("rainier_sync")


class Attempts:
    """Runs one worker's attempts, and owns the child processes timed ones run in."""

    def __init__(
        self,
        executor: Executor,
        manager: QueueManager,
        registry: JobRegistry,
        options: WorkerOptions,
        *,
        recorded: bool = False,
    ) -> None:
        self.executor = executor
        self.manager = manager
        self.registry = registry
        self.options = options
        self.supervisor: Supervisor | None = None
        self._lock = threading.Lock()
        self._warned = False
        self._child_setup = load_child_setup(options.child_setup)
        self._interrupted_at: float | None = None
        #: With ``recorded``, the attempts running now and when each started (seconds
        #: since the epoch), kept only for the worker's record.
        self.started: dict[int, tuple[QueuedJob, float]] | None = {} if recorded else None

    def prepare(self) -> None:
        """Start the fork server now (from the owning thread, before the pool
        threads exist) when any attempt may have a time limit."""
        self._interrupted_at = None
        if self.options.timeout is not None or any(c.TIMEOUT is not None for c in self.registry.classes()):
            self.get_supervisor()

    def timeout(self, job: QueuedJob) -> float | None:
        """The time limit of this attempt: its job's ``TIMEOUT``, else the worker's."""
        job_class = self.registry.find(job.name)
        limit = job_class.TIMEOUT if job_class is not None else None
        return limit if limit is not None else self.options.timeout

    def run(self, job: QueuedJob, stop_requested: threading.Event) -> Completion:
        """Run one attempt: in this thread, or in a supervised child when it has a time
        limit. Never raises: an attempt that raises is abandoned, interrupted."""
        started = self.started
        if started is not None:
            began = _clock.now()
            started[id(job)] = (job, began)
        try:
            completion = self.executor.lost(job)
            if completion is None:
                timeout = self.timeout(job)
                supervisor = None if timeout is None else self.get_supervisor()
                if supervisor is not None and timeout is not None:
                    completion = supervisor.run(job, timeout, stop_requested)
                else:
                    completion = self.executor.run(job, stop_requested)
        except BaseException as exc:  # noqa: BLE001 - never lose a completion
            completion = Completion(job, ABANDONED, exception=exc, interrupted=True)
        if started is not None:
            started.pop(id(job), None)
            completion.wait_bucket = wait_bucket(job, began)
        return completion

    def running_since(self) -> list[tuple[QueuedJob, float]]:
        """The attempts running now, and when each started (seconds since the epoch)."""
        started = self.started
        return list(started.values()) if started else []

    def get_supervisor(self) -> Supervisor | None:
        """The child-process pool for timed attempts (None where it is not available)."""
        if self.supervisor is not None:
            return self.supervisor
        with self._lock:
            if self.supervisor is None:
                if not supported():
                    if not self._warned:
                        self._warned = True
                        log.warning("this platform cannot fork supervised children: time limits are not enforced")
                    return None
                supervisor = Supervisor(
                    self.executor,
                    self.manager,
                    max_jobs_per_child=self.options.max_jobs_per_child,
                    child_setup=self._child_setup,
                )
                supervisor.start()
                self.supervisor = supervisor
            return self.supervisor

    def interrupt_children(self) -> bool:
        """Once the grace period is over, stop the children still running attempts;
        True while those attempts are on their way back (to be handed back)."""
        supervisor = self.supervisor
        if supervisor is None or not supervisor.busy():
            return False
        if self._interrupted_at is None:
            self._interrupted_at = _clock.monotonic()
            supervisor.interrupt()
        return _clock.monotonic() - self._interrupted_at < supervisor.kill_grace + 5.0

    def close(self) -> None:
        """Stop every child and the fork server."""
        with self._lock:
            supervisor, self.supervisor = self.supervisor, None
        if supervisor is not None:
            supervisor.close()
