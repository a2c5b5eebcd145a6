"""TasksBackend on every real driver, with a real Worker running the tasks."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

import pytest
from django.test.utils import override_settings

import rainier_sync
from rainier_sync import QueueManager, Worker, WorkerOptions
from rainier_sync.django.tasks import (
    DEFAULT_KEEP_RESULT,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TasksBackend,
    job_class_for,
    register_tasks,
)
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers.database import DatabaseQueue
from rainier_sync.errors import ConfigurationError, PayloadError
from rainier_sync.registry import JobRegistry

from .conftest import BACKEND, Heard

QUEUES = ["default", "mail"]


def drain(manager: QueueManager) -> None:
    """Run what is due with a real worker, then return."""
    Worker(manager, options=WorkerOptions(queues=QUEUES, once=True, sleep=0.05)).run()


def status(result: Any) -> str:
    return str(result.status)


def test_enqueue_returns_a_ready_result_whose_id_is_the_jobs(manager: QueueManager, tasks: ModuleType) -> None:
    result = tasks.add.enqueue(2, b=3)
    assert status(result) == "READY"
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.enqueued_at is not None and result.enqueued_at.tzinfo is not None
    driver = manager.connection()
    listed = driver.find_job(result.id)
    assert listed is not None and listed.job.name == "tests.django_tasks.tasks.add" and listed.job.queue == "mail"
    again = tasks.add.get_result(result.id)
    assert status(again) == "READY"
    assert again.args == [2, 3] and again.enqueued_at == result.enqueued_at
    assert again.task.func is tasks.add.func and again.task.queue_name == "mail"


def test_a_worker_runs_it_and_get_result_reads_its_outcome(manager: QueueManager, tasks: ModuleType) -> None:
    result = tasks.add.enqueue(2, b=3)
    drain(manager)
    result.refresh()
    assert status(result) == "SUCCESSFUL"
    assert result.return_value == 5
    assert manager.result(result.id).value == 5
    assert result.errors == []
    assert len(result.worker_ids) == 1 and result.worker_ids[0]
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at


def test_each_failed_attempt_is_an_error_and_a_retry_can_succeed(manager: QueueManager, tasks: ModuleType) -> None:
    result = tasks.flaky.enqueue("k", 2)
    drain(manager)
    result.refresh()
    assert status(result) == "SUCCESSFUL" and result.return_value == "k"
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError", "builtins.ValueError"]
    assert "k: attempt 1 fails" in result.errors[0].traceback and "Traceback" in result.errors[0].traceback
    assert result.errors[0].exception_class is ValueError
    assert len(result.worker_ids) == 3 and result.attempts == 3


def test_the_last_failed_attempt_fails_the_task(manager: QueueManager, tasks: ModuleType, heard: Heard) -> None:
    result = tasks.boom.enqueue()
    drain(manager)
    assert len(heard.of("started", result.id)) == 2
    assert [status(r) for r in heard.of("finished", result.id)] == ["FAILED"]
    result.refresh()
    assert status(result) == "FAILED"
    assert [e.exception_class_path for e in result.errors] == ["builtins.LookupError"] * 2
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


def test_an_unknown_id_does_not_exist(manager: QueueManager, tasks: ModuleType) -> None:
    with pytest.raises(TaskResultDoesNotExist, match="nope"):
        tasks.add.get_backend().get_result("nope")


def test_a_running_task_is_running_and_the_signals_are_sent(
    manager: QueueManager, tasks: ModuleType, heard: Heard
) -> None:
    import threading

    tasks.GATES["g"] = threading.Event()
    result = tasks.blocker.enqueue("g")
    assert [r.id for r in heard.of("enqueued")] == [result.id]
    assert heard.events[0][1] is TasksBackend
    worker = Worker(manager, options=WorkerOptions(queues=QUEUES, sleep=0.05))
    worker.start()
    try:
        started = heard.wait("started", result.id)
        assert status(started) == "RUNNING"
        running = tasks.blocker.get_result(result.id)
        assert status(running) == "RUNNING" and running.started_at is not None and running.finished_at is None
        assert len(running.worker_ids) == 1
        assert running.worker_ids[0] in [w.id for w in manager.workers()]
        tasks.GATES["g"].set()
        finished = heard.wait("finished", result.id)
    finally:
        tasks.GATES["g"].set()
        worker.stop()
        worker.join()
    assert status(finished) == "SUCCESSFUL" and finished.return_value == "opened"
    assert status(tasks.blocker.get_result(result.id)) == "SUCCESSFUL"


def test_takes_context_gets_the_attempt_and_the_id(manager: QueueManager, tasks: ModuleType) -> None:
    result = tasks.attempt_of.enqueue(4)
    drain(manager)
    result.refresh()
    assert result.return_value == [1, result.id, 4]


def test_run_after_defers_it(manager: QueueManager, tasks: ModuleType) -> None:
    later = datetime.now(tz=datetime.now().astimezone().tzinfo) + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1)
    drain(manager)
    again = tasks.add.get_result(result.id)
    assert status(again) == "READY"
    assert again.task.run_after is not None and abs(again.task.run_after - later) < timedelta(seconds=1)
    listed = manager.connection().find_job(result.id)
    assert listed is not None and abs(listed.job.available_at - later.timestamp()) < 1


def test_run_after_in_the_past_runs_now(manager: QueueManager, tasks: ModuleType) -> None:
    earlier = datetime.now(tz=datetime.now().astimezone().tzinfo) - timedelta(hours=1)
    result = tasks.add.using(run_after=earlier).enqueue(1)
    drain(manager)
    assert status(tasks.add.get_result(result.id)) == "SUCCESSFUL"


def test_a_higher_priority_runs_first(manager: QueueManager, tasks: ModuleType) -> None:
    assert tasks.record.get_backend().supports_priority is True
    tasks.record.using(priority=-10).enqueue("low")
    tasks.record.enqueue("middle")
    tasks.record.using(priority=10).enqueue("high")
    Worker(manager, options=WorkerOptions(queues=QUEUES, once=True, concurrency=1)).run()
    assert tasks.RAN == ["high", "middle", "low"]


def test_a_unique_task_enqueued_again_returns_the_waiting_copy(manager: QueueManager, tasks: ModuleType) -> None:
    first = tasks.unique_add.enqueue(1)
    second = tasks.unique_add.enqueue(1)
    other = tasks.unique_add.enqueue(2)
    assert second.id == first.id and other.id != first.id
    assert manager.connection().size("default") == 2
    drain(manager)
    third = tasks.unique_add.enqueue(1)  # the lock went with the first copy's success
    assert third.id != first.id
    first.refresh()
    assert first.return_value == 2


@pytest.mark.parametrize("manager", ["memory"], indirect=True)
def test_bad_input_is_refused_naming_it(manager: QueueManager, tasks: ModuleType) -> None:
    with pytest.raises(PayloadError, match="'a'"):
        tasks.add.enqueue(object())
    with pytest.raises(PayloadError, match="'b'"):
        tasks.add.enqueue(1, b={1, 2})
    with pytest.raises(InvalidTaskError, match="queue 'other' is not one of backend 'default'"):
        tasks.add.using(queue_name="other")
    with pytest.raises(InvalidTaskError, match="naive datetime"):
        tasks.add.using(run_after=datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="unexpected keyword"):
        tasks.add.enqueue(1, c=2)
    assert manager.connection().size() == 0


def backends() -> Any:
    from rainier_sync.django.tasks import FRAMEWORK

    if FRAMEWORK == "django.tasks":
        from django.tasks import task_backends
    else:
        from django_tasks import task_backends
    return task_backends


@pytest.mark.parametrize(
    "options, error",
    [
        ({"keep": 1}, "unknown key 'keep'"),
        ({"keep_result": -1}, "keep_result'] must be a positive number"),
        ({"connection": ""}, "connection'] must name a connection"),
    ],
)
def test_bad_options_are_refused_naming_them(options: dict[str, Any], error: str) -> None:
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        with pytest.raises(Exception, match=error) as caught:
            backends()["default"]
    assert "ImproperlyConfigured" in [c.__name__ for c in type(caught.value).__mro__]


def test_what_the_backend_supports(tasks: ModuleType) -> None:
    backend = tasks.add.get_backend()
    assert isinstance(backend, TasksBackend)
    assert backend.supports_defer and backend.supports_get_result and not backend.supports_async_task
    assert backend.keep_result == DEFAULT_KEEP_RESULT == 7 * 86400
    assert job_class_for(tasks.add, backend.keep_result).KEEP_RESULT == DEFAULT_KEEP_RESULT
    assert job_class_for(tasks.flaky, backend.keep_result).TRIES == 3


def test_keep_result_sets_how_long_a_result_is_kept(tasks_settings: dict[str, Any], tasks: ModuleType) -> None:
    store_calls: list[float] = []
    queue = MemoryQueue()
    manager = QueueManager(connections={"m": queue})
    assert manager.locks is not None
    put = manager.locks.put_value

    def spy(key: str, value: str, ttl: float) -> None:
        if key.startswith("django-task:"):
            store_calls.append(ttl)
        put(key, value, ttl)

    manager.locks.put_value = spy  # type: ignore[method-assign]
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": QUEUES, "OPTIONS": {"keep_result": 90}}}):
        previous = rainier_sync.set_instance(manager)
        try:
            result = tasks.record.enqueue("x")
            drain(manager)
            result.refresh()
        finally:
            rainier_sync.set_instance(previous)
    assert status(result) == "SUCCESSFUL"
    assert store_calls[-1] == 90 and store_calls[:-1] and all(ttl == 90 + 7 * 86400 for ttl in store_calls[:-1])


def test_without_a_lock_store_it_says_so(tasks: ModuleType) -> None:
    manager = QueueManager(connections={"m": MemoryQueue()}, locks=None)
    previous = rainier_sync.set_instance(manager)
    try:
        with pytest.raises(ConfigurationError, match="lock store"):
            tasks.add.enqueue(1)
        with pytest.raises(ConfigurationError, match="get_result.*lock store"):
            tasks.add.get_backend().get_result("x")
    finally:
        rainier_sync.set_instance(previous)


def test_the_connection_option_names_a_connection_of_the_manager(tasks: ModuleType) -> None:
    main, other = MemoryQueue(), MemoryQueue()
    manager = QueueManager(connections={"main": main, "other": other}, default="main")
    previous = rainier_sync.set_instance(manager)
    try:
        with override_settings(
            TASKS={"default": {"BACKEND": BACKEND, "QUEUES": QUEUES, "OPTIONS": {"connection": "other"}}}
        ):
            result = tasks.add.enqueue(1, 2)
            assert other.size() == 1 and main.size() == 0
            Worker(manager, options=WorkerOptions(queues=QUEUES, once=True, connection="other")).run()
            result.refresh()
            assert result.return_value == 3
        with override_settings(
            TASKS={"default": {"BACKEND": BACKEND, "QUEUES": QUEUES, "OPTIONS": {"connection": "nope"}}}
        ):
            with pytest.raises(Exception, match="'nope' is not declared"):
                tasks.add.enqueue(1, 2)
    finally:
        rainier_sync.set_instance(previous)


def test_a_worker_with_its_own_registry_runs_tasks_it_registered(tmp_path: Any, tasks: ModuleType) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    sender = QueueManager(connections={"db": queue})
    previous = rainier_sync.set_instance(sender)
    try:
        result = tasks.add.enqueue(5, 6)
    finally:
        rainier_sync.set_instance(previous)
    registry = JobRegistry()
    assert register_tasks(registry) >= 1 and "tests.django_tasks.tasks.add" in registry
    runner = QueueManager(connections={"db": DatabaseQueue.from_url(url)}, registry=registry)
    previous = rainier_sync.set_instance(sender)  # the worker records in its own manager's store: the same tables
    try:
        drain(runner)
        assert tasks.add.get_result(result.id).return_value == 11
    finally:
        rainier_sync.set_instance(previous)
        runner.close()
        sender.close()


@pytest.mark.parametrize("manager", ["sqlite"], indirect=True)
def test_an_attempt_that_overruns_its_timeout_fails(manager: QueueManager, tasks: ModuleType) -> None:
    result = tasks.overruns.enqueue()
    drain(manager)
    result.refresh()
    assert status(result) == "FAILED"
    assert [e.exception_class_path for e in result.errors] == ["rainier_sync.errors.JobTimeoutError"]


def test_it_runs_on_the_framework_of_this_django() -> None:
    import django

    from rainier_sync.django.tasks import FRAMEWORK

    assert FRAMEWORK == ("django.tasks" if django.VERSION >= (6,) else "django_tasks")


def test_on_a_driver_that_ignores_priority_a_priority_is_refused(tasks: ModuleType) -> None:
    from rainier_sync.drivers import SyncQueue
    from rainier_sync.locks import MemoryLockStore

    manager = QueueManager(connections={"sync": SyncQueue()}, locks=MemoryLockStore())
    previous = rainier_sync.set_instance(manager)
    try:
        backend = tasks.add.get_backend()
        assert backend.supports_priority is False
        with pytest.raises(InvalidTaskError, match="priority"):
            tasks.add.using(priority=5).enqueue(1)
        result = tasks.add.enqueue(1, 2)  # the sync driver runs it inline, before enqueue returns
        assert status(result) == "READY"
        result.refresh()
        assert status(result) == "SUCCESSFUL" and result.return_value == 3 and len(result.worker_ids) == 1
    finally:
        rainier_sync.set_instance(previous)


@pytest.mark.parametrize("manager", ["memory"], indirect=True)
def test_a_return_value_that_is_not_json_fails_the_attempt_naming_its_type(
    manager: QueueManager, tasks: ModuleType
) -> None:
    result = tasks.returns_a_set.enqueue()
    drain(manager)
    result.refresh()
    assert status(result) == "FAILED" and len(result.errors) == 2
    assert "set" in result.errors[0].traceback


@pytest.mark.parametrize("manager", ["memory"], indirect=True)
def test_args_and_kwargs_are_as_the_signature_binds_them(manager: QueueManager, tasks: ModuleType) -> None:
    result = tasks.keywords.enqueue(a=2, scale=3)
    assert result.args == [2] and result.kwargs == {"scale": 3}
    again = tasks.keywords.get_result(result.id)
    assert again.args == [2] and again.kwargs == {"scale": 3}
    drain(manager)
    assert tasks.keywords.get_result(result.id).return_value == 6


def test_async_tasks_are_refused(tasks: ModuleType) -> None:
    from rainier_sync.django.tasks import RainierTask

    with pytest.raises(InvalidTaskError, match="async"):
        RainierTask(func=tasks.not_sync)


def test_an_empty_queues_list_allows_any_queue(tasks: ModuleType) -> None:
    manager = QueueManager(connections={"m": MemoryQueue()})
    previous = rainier_sync.set_instance(manager)
    try:
        with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": []}}):
            result = tasks.add.using(queue_name="anything").enqueue(1)
            assert manager.connection().size("anything") == 1
            Worker(manager, options=WorkerOptions(queues=["anything"], once=True)).run()
            assert tasks.add.get_result(result.id).return_value == 1
    finally:
        rainier_sync.set_instance(previous)


@pytest.mark.parametrize(
    "options, error",
    [
        ({"tries": 0}, "tries must be an int >= 1, got 0"),
        ({"timeout": -1}, "timeout must be a positive number of seconds, got -1"),
        ({"unique_for": "1h"}, "unique_for must be a positive number of seconds, got '1h'"),
    ],
)
def test_bad_task_options_are_refused_naming_them(tasks: ModuleType, options: dict[str, Any], error: str) -> None:
    from rainier_sync.django.tasks import RainierTask

    with pytest.raises(InvalidTaskError, match=f"task tests.django_tasks.tasks.add: {error}"):
        RainierTask(func=tasks.add.func, **options)
