"""Django tasks the suite enqueues; imported once the test TASKS are in force."""

from __future__ import annotations

import threading
import time
from typing import Any

from rainier_sync.backoff import none
from rainier_sync.django.tasks import FRAMEWORK

if FRAMEWORK == "django.tasks":
    from django.tasks import task
else:
    from django_tasks import task

#: Attempts each key of ``flaky`` has made, and the gates ``blocker`` waits on.
ATTEMPTS: dict[str, int] = {}
GATES: dict[str, threading.Event] = {}
RAN: list[str] = []


@task(queue_name="mail")
def add(a: int, b: int = 0) -> int:
    return a + b


@task(tries=3, backoff=none)
def flaky(key: str, failures: int) -> str:
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] <= failures:
        raise ValueError(f"{key}: attempt {ATTEMPTS[key]} fails")
    return key


@task(tries=2, backoff=none)
def boom() -> None:
    raise LookupError("nothing here")


@task(takes_context=True)
def attempt_of(context: Any, x: int) -> list[Any]:
    return [context.attempt, context.task_result.id, x]


@task()
def blocker(key: str) -> str:
    if not GATES[key].wait(60):
        raise TimeoutError(f"gate {key} never opened")
    return "opened"


@task(unique_for=60)
def unique_add(a: int) -> int:
    return a + 1


@task()
def record(name: str) -> None:
    RAN.append(name)


@task(timeout=1)
def overruns() -> None:
    time.sleep(30)


@task(tries=2, backoff=0)
def returns_a_set() -> Any:
    return {1, 2}


@task()
def keywords(a: int, *, scale: int = 1) -> int:
    return a * scale


async def not_sync() -> None:
    """Not a task: async functions are refused (see the tests)."""
