"""Jobs the Redis reliability tests run, in this process or in worker subprocesses.

Each records what it did in Redis, under the test's own key prefix, so the
test can count runs across processes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import redis

from rainier_sync import Container, Job, JobContext, JobRegistry


@dataclass
class Record(Job):
    """Counts its runs: ``HINCRBY <prefix>ran <n> 1``."""

    NAME = "redis-tests.record"
    TRIES = 3

    prefix: str
    n: int

    def handle(self, context: JobContext) -> None:
        context.resolve(redis.Redis).hincrby(self.prefix + "ran", str(self.n), 1)


@dataclass
class Hang(Job):
    """First attempt announces itself and hangs (to be killed); a later one records its attempt."""

    NAME = "redis-tests.hang"
    TRIES = 3

    prefix: str

    def handle(self, context: JobContext) -> None:
        client = context.resolve(redis.Redis)
        if context.attempt == 1:
            client.set(self.prefix + "hanging-pid", os.getpid())
            time.sleep(120)  # killed long before this ends
            return
        client.set(self.prefix + "finished-attempt", context.attempt)


@dataclass
class Flaky(Job):
    """Fails its first attempt; backs off 30 s; records the attempt that succeeded."""

    NAME = "redis-tests.flaky"
    TRIES = 3

    prefix: str

    def handle(self, context: JobContext) -> None:
        if context.attempt == 1:
            raise RuntimeError("first attempt fails")
        context.resolve(redis.Redis).set(self.prefix + "flaky-succeeded", context.attempt)

    def backoff(self, attempt: int) -> float:
        return 30


def registry() -> JobRegistry:
    return JobRegistry().with_job(Record).with_job(Hang).with_job(Flaky)


def container(url: str) -> Container:
    return Container().instance(redis.Redis, redis.Redis.from_url(url))
