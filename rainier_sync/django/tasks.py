"""A backend of Django's tasks framework run by rainier_sync's workers.

``TASKS = {"default": {"BACKEND": "rainier_sync.django.TasksBackend", ...}}``
makes every ``@task`` function a function job (:func:`rainier_sync.job`)
whose ``NAME`` is the task's ``module_path``: ``enqueue`` dispatches it through
the manager (:func:`rainier_sync.instance`, or the connection ``OPTIONS``
names), a rainier_sync worker runs it, and ``get_result`` reads what the
workers recorded of it in the manager's lock store.

Django 6 has the framework as ``django.tasks``; Django 4.2 to 5.2 have it from
the ``django-tasks`` package (``django_tasks``). This module uses whichever is
there, ``django.tasks`` first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from .. import _clock, signals
from ..drivers.extensions import ListsJobs
from ..errors import ConfigurationError
from ..execution import result_key
from ..functions import FunctionJob, job
from ..jobs import JobContext, check_job_class
from ..manager import QueueManager, instance
from ..types import ExceptionInfo, QueuedJob, decode, encode

try:  # Django 6
    from django.tasks.backends.base import BaseTaskBackend  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from django.tasks.base import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        DEFAULT_TASK_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask as InvalidTaskError  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from django.tasks.exceptions import InvalidTaskBackend as InvalidTaskBackendError  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from django.tasks.exceptions import TaskResultDoesNotExist  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from django.tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[import-not-found, import-untyped, unused-ignore]

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 4.2-5.2 with the django-tasks package
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from django_tasks.base import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        DEFAULT_TASK_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskBackendError, InvalidTaskError, TaskResultDoesNotExist  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[import-not-found, import-untyped, unused-ignore]

    FRAMEWORK = "django_tasks"

if TYPE_CHECKING:
    from ..registry import JobRegistry
    from ..state.base import LockStore

__all__ = [
    "TasksBackend",
    "RainierTask",
    "register_tasks",
    "task_key",
    "DEFAULT_KEEP_RESULT",
    "FRAMEWORK",
    "TaskResultDoesNotExist",
    "InvalidTaskError",
]

#: Seconds a finished task's result is kept when ``OPTIONS`` give no ``keep_result``: a week.
DEFAULT_KEEP_RESULT = 7 * 86400
#: Seconds a task's record is kept while it waits or runs, beyond ``keep_result``.
_WAITING = 7 * 86400
#: The backend's ``OPTIONS``.
_OPTIONS = ("connection", "keep_result")

_UTC = timezone.utc


def task_key(task_id: str) -> str:
    """Where the workers keep what they recorded of task ``task_id`` in the lock store."""
    return f"django-task:{task_id}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RainierTask(Task):  # type: ignore[misc, unused-ignore]
    """A Django task with what rainier_sync adds: ``@task(tries=5, backoff=...,
    timeout=30, unique_for=3600)``. ``tries`` is the number of attempts
    (default 1); ``backoff`` the seconds before a retry (a number, a strategy
    of :mod:`rainier_sync.backoff` or a tenacity wait); ``timeout`` the seconds
    an attempt may run (in a supervised child process); ``unique_for`` makes the
    task unique by its arguments: enqueued again while a copy with the same
    arguments waits or runs, it returns that copy's result instead of queueing
    another, the lock outliving a dead worker by at most that many seconds."""

    tries: int | None = None
    backoff: Any = None
    timeout: float | None = None
    unique_for: float | None = None


class TaskJob(FunctionJob):
    """The function job a Django task runs as (made by :func:`job_class_for`)."""

    TASK_PATH: ClassVar[str]
    BACKEND_ALIAS: ClassVar[str]

    __slots__ = ()

    def call_function(self, context: JobContext | None) -> Any:
        cls = type(self)
        bound = inspect.BoundArguments(cls.SIGNATURE, self.arguments)
        if not cls.TAKES_CONTEXT:
            return cls.FUNCTION(*bound.args, **bound.kwargs)
        task = _TASKS[cls.TASK_PATH]
        attempt = context.attempt if context is not None else 1
        task_id = context.id if context is not None else "call"
        result = TaskResult(
            task=task,
            id=task_id,
            status=TaskResultStatus.RUNNING,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(bound.args),
            kwargs=dict(bound.kwargs),
            backend=cls.BACKEND_ALIAS,
            errors=[],
            worker_ids=[_process_id()] * attempt,  # context.attempt reads their count
        )
        return cls.FUNCTION(TaskContext(task_result=result), *bound.args, **bound.kwargs)


#: Every task a TasksBackend has seen, by module path, and its job class.
_TASKS: dict[str, Any] = {}
_JOBS: dict[str, type[TaskJob]] = {}
_JOBS_LOCK = threading.Lock()


def _unique_by_arguments(made: FunctionJob) -> str:
    return hashlib.sha256(made.encoded_payload()[1].encode()).hexdigest()[:32]


def job_class_for(task: Any, keep_result: float) -> type[TaskJob]:
    """The job class of ``task`` (made once per module path, then reused)."""
    path = task.module_path
    found = _JOBS.get(path)
    if found is not None and found.FUNCTION is task.func:
        return found
    with _JOBS_LOCK:
        found = _JOBS.get(path)
        if found is not None and found.FUNCTION is task.func:
            return found
        options: dict[str, Any] = {"queue": task.queue_name, "keep_result": keep_result}
        if task.takes_context:
            options["takes_context"] = True
        tries = getattr(task, "tries", None)
        if tries is not None:
            options["tries"] = tries
        for name in ("backoff", "timeout", "unique_for"):
            value = getattr(task, name, None)
            if value is not None:
                options[name] = value
        if getattr(task, "unique_for", None) is not None:
            options["unique_id"] = _unique_by_arguments
        base = job(path, **options)(task.func)
        made = type(
            base.__name__,
            (TaskJob, base),
            {
                "TASK_PATH": path,
                "BACKEND_ALIAS": task.backend,
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "__slots__": (),
            },
        )
        check_job_class(made)
        _JOBS[path] = made
        _TASKS[path] = task
        return made


def register_tasks(registry: JobRegistry) -> int:
    """Register in ``registry`` the job class of every task a TasksBackend has
    seen in this process (tasks are seen when their module is imported: import
    each app's ``tasks`` module first, e.g. with
    ``django.utils.module_loading.autodiscover_modules("tasks")``); returns how
    many. A worker process calls this before it runs, so it knows the tasks'
    names; the backend registers a task itself when it enqueues one."""
    with _JOBS_LOCK:
        made = list(_JOBS.values())
    for cls in made:
        if registry.find(cls.NAME) is not cls:
            registry.register(cls)
    return len(made)


def _process_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _worker_id(sender: Any) -> str:
    """The id of the worker that runs an attempt: its fleet record's where it has one."""
    fleet = getattr(sender, "fleet", None)
    found = getattr(fleet, "id", None)
    return found if isinstance(found, str) else _process_id()


def _stamp(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=_UTC)


def _error_of(info: ExceptionInfo) -> dict[str, str]:
    kind = info.kind if "." in info.kind else f"builtins.{info.kind}"
    return {"exception_class_path": kind, "traceback": info.traceback or f"{info.error}\n"}


class TasksBackend(BaseTaskBackend):  # type: ignore[misc, unused-ignore]
    """Django's tasks, queued and run by rainier_sync.

    ``QUEUES`` lists the queues a task may name (Django's rule: an empty list
    allows any). ``OPTIONS``: ``connection`` (a connection of the manager; its
    default when left out) and ``keep_result`` (seconds a finished task's result
    is kept; default a week). The manager is :func:`rainier_sync.instance`,
    read at each call; it needs a lock store, where the results are kept.
    """

    task_class = RainierTask
    supports_defer = True
    supports_get_result = True
    supports_async_task = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options or {})
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InvalidTaskBackendError(
                f"TASKS[{alias!r}]['OPTIONS'] has an unknown key {unknown[0]!r} (known: {', '.join(_OPTIONS)})"
            )
        keep = options.get("keep_result", DEFAULT_KEEP_RESULT)
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep <= 0:
            raise InvalidTaskBackendError(
                f"TASKS[{alias!r}]['OPTIONS']['keep_result'] must be a positive number of seconds, got {keep!r}"
            )
        connection = options.get("connection")
        if connection is not None and (not isinstance(connection, str) or not connection):
            raise InvalidTaskBackendError(
                f"TASKS[{alias!r}]['OPTIONS']['connection'] must name a connection of the manager, got {connection!r}"
            )
        self.keep_result: float = keep
        self.connection_name: str | None = connection
        self._plans: dict[Any, tuple[QueueManager, type[TaskJob], Any]] = {}

    # -- what it runs on ---------------------------------------------------------------
    @property
    def manager(self) -> QueueManager:
        """The manager the tasks go through: :func:`rainier_sync.instance`."""
        return instance()

    def _driver(self, manager: QueueManager) -> Any:
        return manager.connection(self.connection_name)

    @property
    def supports_priority(self) -> bool:  # type: ignore[override, unused-ignore]
        """Whether the connection's driver runs a queue's jobs by priority (True
        while no manager is set: it is checked again at ``enqueue``)."""
        from ..errors import NoQueueConfiguredError

        try:
            driver = self._driver(self.manager)
        except NoQueueConfiguredError:
            return True
        return bool(driver.capabilities.priority)

    def _store(self, manager: QueueManager, what: str) -> LockStore:
        if manager.locks is None:
            raise ConfigurationError(
                f"task backend {self.alias!r}: {what} needs the manager's lock store, where the workers record "
                "tasks and their results, and the manager has none: give QueueManager "
                "locks=RedisLockStore.from_url(...) or DatabaseLockStore.from_url(...)"
            )
        return manager.locks

    # -- checking ------------------------------------------------------------------------
    def validate_task(self, task: Any) -> None:
        """Django's checks, with what this backend needs said by name: a known
        queue, ``run_after`` with a time zone, options it can run."""
        where = f"task {task.module_path}"
        if self.queues and task.queue_name not in self.queues:
            known = ", ".join(sorted(self.queues))
            raise InvalidTaskError(
                f"{where}: queue {task.queue_name!r} is not one of backend {self.alias!r}'s QUEUES ({known})"
            )
        run_after = task.run_after
        if run_after is not None:
            if not isinstance(run_after, datetime):
                raise InvalidTaskError(f"{where}: run_after must be a datetime, got {run_after!r}")
            if run_after.tzinfo is None or run_after.utcoffset() is None:
                raise InvalidTaskError(
                    f"{where}: run_after {run_after.isoformat()} is a naive datetime: give it a time zone "
                    "(django.utils.timezone.now() + timedelta(...))"
                )
        tries = getattr(task, "tries", None)
        if tries is not None and (isinstance(tries, bool) or not isinstance(tries, int) or tries < 1):
            raise InvalidTaskError(f"{where}: tries must be an int >= 1, got {tries!r}")
        for name in ("timeout", "unique_for"):
            value = getattr(task, name, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise InvalidTaskError(f"{where}: {name} must be a positive number of seconds, got {value!r}")
        super().validate_task(task)

    # -- enqueueing ------------------------------------------------------------------------
    def _plan(self, task: Any, manager: QueueManager) -> tuple[QueueManager, type[TaskJob], Any]:
        """What enqueueing ``task``'s function through ``manager`` needs, found
        once: its job class (registered in the manager's registry) and the
        connection's driver."""
        self.validate_task(task)
        driver = self._driver(manager)
        cls = job_class_for(task, self.keep_result)
        if manager.registry.find(cls.NAME) is not cls:
            manager.registry.register(cls)
        plan = (manager, cls, driver)
        self._plans[task.func] = plan
        return plan

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Dispatch ``task`` with ``args`` and ``kwargs`` (JSON only; refused
        naming the argument that is not); a READY ``TaskResult`` whose id is the job's."""
        manager = instance()
        plan = self._plans.get(task.func)
        if plan is None or plan[0] is not manager:
            plan = self._plan(task, manager)
        cls, driver = plan[1], plan[2]
        # The task was checked when it was made (Task.__post_init__), perhaps by another
        # backend instance: what this one may see differently is checked again here.
        if task.queue_name not in self.queues and self.queues:
            self.validate_task(task)
        if task.priority != DEFAULT_TASK_PRIORITY and not driver.capabilities.priority:
            raise InvalidTaskError(
                f"task {task.module_path}: priority {task.priority} given, but connection "
                f"{self.connection_name or manager.default!r} does not run jobs by priority"
            )
        made = cls(*args, **kwargs)
        delay = 0.0
        if task.run_after is not None:
            self.validate_task(task)
            delay = max(0.0, task.run_after.timestamp() - _clock.now())
        connection = self.connection_name
        queued = manager.build(made, queue=task.queue_name, delay=delay, priority=-task.priority, connection=connection)
        if queued.unique_key is not None:
            queued.unique_owner = queued.id  # a duplicate finds the copy it defers to by the lock's owner
        if not driver.capabilities.listing:  # get_result cannot read a waiting job back from this driver
            self._write(self._store(manager, "enqueueing a task"), queued.id, self._waiting(task, queued))
        if manager.send_queued(connection, [queued])[0] is None:
            return self._duplicate(manager, task, queued)
        if kwargs or len(args) != len(made.arguments):
            bound = inspect.BoundArguments(cls.SIGNATURE, made.arguments)
            args, kwargs = bound.args, bound.kwargs
        result = _ready(
            task, queued.id, datetime.fromtimestamp(queued.dispatched_at, tz=_UTC), args, kwargs, self.alias
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def _duplicate(self, manager: QueueManager, task: Any, queued: QueuedJob) -> Any:
        """The result of the copy a unique task's duplicate deferred to."""
        assert queued.unique_key is not None
        store = self._store(manager, "a unique task")
        owner = store.owner(queued.unique_key)
        if owner is not None:
            try:
                return self.get_result(owner)
            except TaskResultDoesNotExist:
                pass
        raise InvalidTaskError(
            f"task {task.module_path}: a copy with the same arguments is queued or running (unique_for), "
            "and its result could not be read"
        )

    def _waiting(self, task: Any, queued: QueuedJob) -> dict[str, Any]:
        cls = _JOBS[task.module_path]
        bound = inspect.BoundArguments(cls.SIGNATURE, dict(queued.payload))
        return {
            "path": queued.name,
            "status": "READY",
            "args": list(bound.args),
            "kwargs": dict(bound.kwargs),
            "queue": queued.queue,
            "priority": -queued.priority,
            "run_after": queued.available_at if queued.available_at > queued.dispatched_at else None,
            "enqueued_at": queued.dispatched_at,
            "started_at": None,
            "last_attempted_at": None,
            "finished_at": None,
            "worker_ids": [],
            "errors": [],
        }

    def _write(self, store: LockStore, task_id: str, record: dict[str, Any]) -> None:
        finished = record["status"] in ("SUCCESSFUL", "FAILED")
        store.put_value(task_key(task_id), encode(record), self.keep_result + (0 if finished else _WAITING))

    # -- results -------------------------------------------------------------------------------
    def get_result(self, result_id: str) -> Any:
        """The task ``result_id`` as the workers last recorded it; an id no task
        has (or whose result expired) raises ``TaskResultDoesNotExist``."""
        manager = self.manager
        store = self._store(manager, "get_result()")
        text = store.get_value(task_key(result_id))
        if text is None:
            record = self._read_waiting(manager, store, result_id)
            if record is None:
                text = store.get_value(task_key(result_id))  # it may have started meanwhile
                if text is None:
                    raise TaskResultDoesNotExist(f"no task {result_id!r} is known to backend {self.alias!r}")
                record = decode(text)
        else:
            record = decode(text)
        return self._result(result_id, record)

    def _read_waiting(self, manager: QueueManager, store: LockStore, task_id: str) -> dict[str, Any] | None:
        """The record of a task no worker has started, read back from the queue."""
        mark = store.get_value(result_key(task_id))
        if mark is None or decode(mark).get("status") != "pending":
            return None
        driver = self._driver(manager)
        if not driver.capabilities.listing:
            return None
        listed = ListsJobs.of(driver).find_job(task_id)
        if listed is None:
            return None
        queued = listed.job
        task = self._task_named(queued.name)
        if task is None:
            return None
        job_class_for(task, self.keep_result)
        return self._waiting(task, queued)

    def _task_named(self, path: str) -> Any:
        task = _TASKS.get(path)
        if task is not None:
            return task
        from django.utils.module_loading import import_string  # type: ignore[import-not-found, import-untyped, unused-ignore]

        try:
            found = import_string(path)
        except ImportError:
            return None
        return found if isinstance(found, Task) else None

    def _result(self, task_id: str, record: dict[str, Any]) -> Any:
        task = self._task_named(str(record["path"]))
        if task is None:
            raise TaskResultDoesNotExist(
                f"task {task_id!r} runs {record['path']!r}, which is not a task this process can import"
            )
        changes: dict[str, Any] = {}
        if record.get("queue") and record["queue"] != task.queue_name:
            changes["queue_name"] = record["queue"]
        if record.get("priority") is not None and record["priority"] != task.priority:
            changes["priority"] = record["priority"]
        if record.get("run_after") is not None:
            changes["run_after"] = _stamp(record["run_after"])
        if changes:
            task = task.using(**changes)
        result = TaskResult(
            task=task,
            id=task_id,
            status=TaskResultStatus(record["status"]),
            enqueued_at=_stamp(record.get("enqueued_at")),
            started_at=_stamp(record.get("started_at")),
            finished_at=_stamp(record.get("finished_at")),
            last_attempted_at=_stamp(record.get("last_attempted_at")),
            args=list(record.get("args") or []),
            kwargs=dict(record.get("kwargs") or {}),
            backend=self.alias,
            errors=[TaskError(**error) for error in record.get("errors") or []],
            worker_ids=list(record.get("worker_ids") or []),
        )
        if record["status"] == "SUCCESSFUL":
            object.__setattr__(result, "_return_value", record.get("value"))
        return result

    # -- what the workers record ---------------------------------------------------------------
    def _recorded(self, queued: QueuedJob, store: LockStore) -> dict[str, Any]:
        text = store.get_value(task_key(queued.id))
        if text is not None:
            record: dict[str, Any] = decode(text)
            return record
        return self._waiting(_TASKS[queued.name], queued)

    def _worker_store(self, sender: Any) -> LockStore:
        """The lock store of the manager running an attempt: the worker's (or the
        manager's, for ``dispatch_now``), else the instance's."""
        manager = sender if isinstance(sender, QueueManager) else getattr(sender, "manager", None)
        if not isinstance(manager, QueueManager) or manager.locks is None:
            manager = self.manager
        return self._store(manager, "running a task")

    def _started(self, sender: Any, queued: QueuedJob) -> None:
        store = self._worker_store(sender)
        record = self._recorded(queued, store)
        now = _clock.now()
        record["status"] = "RUNNING"
        record["started_at"] = record.get("started_at") or now
        record["last_attempted_at"] = now
        record["finished_at"] = None
        record["worker_ids"] = [*record.get("worker_ids", []), _worker_id(sender)]
        self._write(store, queued.id, record)
        task_started.send(type(self), task_result=self._result(queued.id, record))

    def _settled(self, sender: Any, queued: QueuedJob, status: str, info: ExceptionInfo | None = None) -> None:
        store = self._worker_store(sender)
        record = self._recorded(queued, store)
        if info is not None:
            record["errors"] = [*record.get("errors", []), _error_of(info)]
        record["status"] = status
        if status in ("SUCCESSFUL", "FAILED"):
            record["finished_at"] = _clock.now()
        if status == "SUCCESSFUL":
            kept = store.get_value(result_key(queued.id))
            record["value"] = decode(kept).get("value") if kept is not None else None
        self._write(store, queued.id, record)
        if status in ("SUCCESSFUL", "FAILED"):
            task_finished.send(type(self), task_result=self._result(queued.id, record))


_READY = TaskResultStatus.READY
_SCALARS = frozenset({str, int, float, bool, type(None)})
#: TaskResult's fields, as this module fills them in :func:`_ready`.
_FIELDS = {
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
}
_FILLED_DIRECTLY = {field.name for field in dataclasses.fields(TaskResult)} == _FIELDS


def _ready(task: Any, task_id: str, enqueued_at: datetime, args: Any, kwargs: dict[str, Any], alias: str) -> Any:
    """A READY TaskResult, as ``TaskResult(...)`` makes it. Arguments of plain
    values (what most calls pass) are filled in directly: the constructor's JSON
    normalisation would return them as they are, and it is most of the cost."""
    if kwargs or not _FILLED_DIRECTLY or not _SCALARS.issuperset(map(type, args)):
        return TaskResult(
            task=task,
            id=task_id,
            status=_READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=alias,
            errors=[],
            worker_ids=[],
        )
    made = object.__new__(TaskResult)
    put = object.__setattr__
    put(made, "task", task)
    put(made, "id", task_id)
    put(made, "status", _READY)
    put(made, "enqueued_at", enqueued_at)
    put(made, "started_at", None)
    put(made, "finished_at", None)
    put(made, "last_attempted_at", None)
    put(made, "args", list(args))
    put(made, "kwargs", {})
    put(made, "backend", alias)
    put(made, "errors", [])
    put(made, "worker_ids", [])
    put(made, "_return_value", None)
    return made


# -- the workers' side: rainier_sync's signals, for jobs that are tasks ---------------------------
def _backend_of(queued: QueuedJob) -> TasksBackend | None:
    cls = _JOBS.get(queued.name)
    if cls is None:
        return None
    backend = _task_backends()[cls.BACKEND_ALIAS]
    return backend if isinstance(backend, TasksBackend) else None


def _task_backends() -> Any:
    if FRAMEWORK == "django.tasks":
        from django.tasks import task_backends  # type: ignore[import-not-found, import-untyped, unused-ignore]
    else:
        from django_tasks import task_backends  # type: ignore[import-not-found, import-untyped, unused-ignore]
    return task_backends


def _on(signal: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def connect(receiver: Callable[..., None]) -> Callable[..., None]:
        def guarded(sender: Any, **kwargs: Any) -> None:
            queued = kwargs.get("job")
            if isinstance(queued, QueuedJob) and queued.name in _JOBS:
                backend = _backend_of(queued)
                if backend is not None:
                    receiver(backend, sender, queued, **kwargs)

        signal.connect(guarded, weak=False)
        return receiver

    return connect


@_on(signals.job_processing)
def _processing(backend: TasksBackend, sender: Any, queued: QueuedJob, **kwargs: Any) -> None:
    backend._started(sender, queued)


@_on(signals.job_attempt_failed)
def _attempt_failed(backend: TasksBackend, sender: Any, queued: QueuedJob, **kwargs: Any) -> None:
    info = kwargs.get("exception")
    if not isinstance(info, ExceptionInfo):
        info = ExceptionInfo(kind="Exception", message=str(kwargs.get("error", "")))
    backend._settled(sender, queued, "FAILED" if kwargs.get("final_attempt") else "READY", info)


@_on(signals.job_processed)
def _processed(backend: TasksBackend, sender: Any, queued: QueuedJob, **kwargs: Any) -> None:
    backend._settled(sender, queued, "SUCCESSFUL")


def _handed_back(backend: TasksBackend, sender: Any, queued: QueuedJob, **kwargs: Any) -> None:
    backend._settled(sender, queued, "READY")


for _signal in (signals.job_interrupted, signals.job_deferred):
    _on(_signal)(_handed_back)
