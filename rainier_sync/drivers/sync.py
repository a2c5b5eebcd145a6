"""The sync driver: runs each job inline, inside ``dispatch``."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from .. import _clock
from ..errors import ConfigurationError
from ..execution import Executor
from ..pending import Dispatcher
from ..types import ExceptionInfo, FailedJob, QueuedJob, as_exception_info
from .base import BaseQueue, Binding, Capabilities, Promises, QueueDriver
from .spec import BootContext, DriverSpec

if TYPE_CHECKING:
    from ..container import Container
    from ..registry import JobRegistry

__all__ = ["SyncQueue"]


#: What the sync driver promises about the jobs it accepts.
PROMISES = Promises(deferred=False, survives_a_restart=False)


class SyncQueue(BaseQueue):
    """Runs the job during ``dispatch``: retries run at once, without sleeping
    through the backoff, and a final failure raises to the dispatcher.

    Right for development and for tests that want the side effect; wrong in
    production, where it couples the request to the job. The manager hands it
    the registry and the container unless they are given here.
    """

    driver = QueueDriver.SYNC
    promises = PROMISES
    capabilities = Capabilities(priority=False, renews=False)

    def __init__(self, registry: JobRegistry | None = None, container: Container | None = None) -> None:
        self.registry = registry
        self.container = container
        self._executor: Executor | None = None
        #: Jobs whose final attempt failed (the failure was also raised).
        self.failed: list[FailedJob] = []

    def bind(self, manager: Binding, connection: str) -> None:
        super().bind(manager, connection)
        self.registry = self.registry or manager.registry
        self.container = self.container or manager.container
        self._executor = Executor(
            self.registry,
            self.container,
            locks=manager.locks,
            sender=self,
            dispatcher=manager if isinstance(manager, Dispatcher) else None,
        )

    def _get_executor(self) -> Executor:
        if self._executor is None:
            if self.registry is None or self.container is None:
                raise ValueError(
                    "SyncQueue needs a registry and a container: give them, or declare it on a QueueManager"
                )
            self._executor = Executor(self.registry, self.container, sender=self)
        return self._executor

    def push(self, job: QueuedJob) -> str:
        return self._get_executor().run_inline(replace(job, connection=self.connection), self.failed.append)

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        return [self.push(job) for job in jobs]

    def reserve_many(self, queues: Sequence[str], limit: int) -> list[QueuedJob]:
        return []

    def acknowledge(self, job: QueuedJob) -> None:
        pass

    def release(self, job: QueuedJob, delay: float = 0) -> None:
        pass

    def fail(self, job: QueuedJob, error: BaseException | str | ExceptionInfo) -> FailedJob:
        failed = FailedJob.of(job, as_exception_info(error), _clock.now())
        self.failed.append(failed)
        return failed

    def reclaim_expired(self) -> int:
        return 0

    def extend(self, jobs: QueuedJob | Sequence[QueuedJob], seconds: float | None = None) -> None:
        pass  # nothing here is ever reserved

    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        return list(reversed(self.failed))[:limit]

    def retry_failed(self, id: str) -> bool:
        for index, failed in enumerate(self.failed):
            if failed.id == id:
                del self.failed[index]
                job = failed.job or QueuedJob(
                    id=failed.id, name=failed.name, queue=failed.queue, payload=failed.payload
                )
                self.push(job)
                return True
        return False

    def forget_failed(self, id: str) -> bool:
        for index, failed in enumerate(self.failed):
            if failed.id == id:
                del self.failed[index]
                return True
        return False

    def size(self, queue: str | None = None) -> int:
        return 0


def _prepare(where: str, context: BootContext) -> dict[str, Any]:
    for what, given in (("registry", context.registry), ("container", context.container)):
        if given is None:
            article = "the job registry" if what == "registry" else "the container"
            raise ConfigurationError(
                f"{where}: sync runs jobs inline and needs {article}; pass {what}= or QueueResources({what}=...)"
            )
    return {"registry": context.registry, "container": context.container}


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> SyncQueue:
    return SyncQueue(prepared["registry"], prepared["container"])


SPEC = DriverSpec(
    promises=PROMISES,
    name="sync",
    rank=0,
    build=_build,
    prepare=_prepare,
    env_refused={"QUEUE_RESERVATION": ("sync runs jobs inline and reserves none", "nothing")},
)
