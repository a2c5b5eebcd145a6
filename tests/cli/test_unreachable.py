"""A backend that cannot be reached ends a command with exit 1 (an operation
failed), not 2 (usage): Redis on a loopback port nothing listens on."""

from __future__ import annotations

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
