"""A backend that cannot be reached ends a command with exit 1 (an operation
failed), not 2 (usage): Redis on a loopback port nothing listens on, and a real
Redis stopped with SIGSTOP (it accepts connections and never answers), met with
the default timeouts. A Redis database index the server does not have is a
configuration mistake: exit 2 at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port

from .conftest import run

pytest.importorskip("redis", reason="the redis extra is not installed")


@pytest.mark.parametrize(
    "command",
    [
        ["queue:status"],
        ["queue:failed"],
        ["queue:failed", "0123456789abcdef"],
        ["queue:retry", "all"],
        ["queue:reclaim"],
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_redis_on_a_closed_port_exits_1_with_one_line(command: list[str]) -> None:
    port = free_port()
    done = run(*command, env={"QUEUE_DRIVER": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0"}, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("rainier-sync: error: ") and done.stderr.count("\n") == 1
    assert f"127.0.0.1:{port}" in done.stderr


def test_a_once_worker_on_a_closed_port_waits_give_up_then_exits_1_saying_why() -> None:
    port = free_port()
    done = run("queue:work", "--once", "--give-up=1", "--app=tests.cli.app:from_env",
               env={"QUEUE_DRIVER": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0"}, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    *logged, last = done.stderr.splitlines()
    assert last.startswith("rainier-sync: error: ") and f"127.0.0.1:{port}" in last
    assert "has not answered since the worker started" in last and "giving up this --once run" in last
    assert any("queue operation start on connection 'redis' failed" in line for line in logged), done.stderr


def test_a_once_run_gives_up_after_the_time_it_was_given() -> None:
    done = run("queue:work", "--once", "--give-up=0.5", "--app=tests.cli.app:down", timeout=60)
    assert done.returncode == 1, done.stderr
    assert "kept failing for" in done.stderr and "giving up this --once run" in done.stderr


@pytest.fixture
def frozen_redis_url(tmp_path: Path) -> Iterator[str]:
    """A real redis-server of the test's own, stopped with SIGSTOP: it accepts connections and never answers."""
    from tests.drivers.redis.frozen import frozen_redis

    with frozen_redis(tmp_path) as url:
        yield url


@pytest.mark.parametrize(
    "command",
    [["queue:work", "--once", "--give-up=5", "--app=tests.cli.app:from_env"], ["queue:status"]],
    ids=lambda command: command[0],
)
def test_a_frozen_redis_ends_the_command_with_exit_1_saying_why(command: list[str], frozen_redis_url: str) -> None:
    # the default timeouts: nothing declared beside QUEUE_DRIVER and REDIS_URL
    done = run(*command, env={"QUEUE_DRIVER": "redis", "REDIS_URL": frozen_redis_url}, timeout=60)
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("rainier-sync: error: "), done.stderr
    where = frozen_redis_url.removeprefix("redis://").split("/")[0]
    assert where in last and "no reply within 5000 ms (response_timeout_ms)" in last, last


def _missing_index(redis_url: str) -> tuple[str, int]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        databases = int(client.config_get("databases")["databases"])
    finally:
        client.close()
    return redis_url.rsplit("/", 1)[0] + f"/{databases}", databases


@pytest.mark.parametrize(
    "command",
    [
        ["queue:status"],
        ["queue:failed"],
        # a run that retried it as an outage would outlast the command's time limit
        ["queue:work", "--once", "--give-up=120", "--app=tests.cli.app:from_env"],
    ],
    ids=lambda command: command[0],
)
def test_a_redis_database_index_that_does_not_exist_exits_2_naming_it(command: list[str], redis_url: str) -> None:
    url, index = _missing_index(redis_url)
    done = run(*command, env={"QUEUE_DRIVER": "redis", "REDIS_URL": url}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "failed:" not in done.stderr, "nothing was retried as an outage"
    # queue:work logs that its worker started (INFO) before its first operation meets the refusal.
    said = [line for line in done.stderr.splitlines() if " INFO rainier_sync: " not in line]
    assert len(said) == 1 and said[0].startswith("rainier-sync: error: "), done.stderr
    assert f"database index {index}" in done.stderr and "DB index is out of range" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "command",
    [["queue:status"], ["queue:work", "--once", "--give-up=120", "--app=tests.cli.app:from_env"]],
    ids=lambda command: command[0],
)
def test_credentials_redis_refuses_exit_2_at_once_naming_them(command: list[str], redis_url: str) -> None:
    """A user Redis does not know (WRONGPASS) is a mistake in the configuration, not an outage."""
    url = redis_url.replace("redis://", "redis://nobody-here:wrong@", 1)
    done = run(*command, env={"QUEUE_DRIVER": "redis", "REDIS_URL": url}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "failed:" not in done.stderr, "nothing was retried as an outage"
    assert "refused the URL's credentials" in done.stderr, done.stderr
