"""Test-suite wiring: every module in tests/services/ is a fixture plugin
(one per real server: PostgreSQL, MariaDB, Redis, moto's SQS, tansu), and the
tests that run worker processes and kill them are kept to one xdist worker."""

from __future__ import annotations

import pathlib

import pytest

pytest_plugins = sorted(
    f"tests.services.{path.stem}"
    for path in (pathlib.Path(__file__).parent / "tests" / "services").glob("*.py")
    if path.stem != "__init__"
)


#: Test modules that run worker processes side by side and kill them. xdist
#: (``-n`` in pyproject.toml) runs them one after another on one of its workers,
#: so they never compete with each other for the machine's cores; a test
#: elsewhere says the same with ``@pytest.mark.processes``.
PROCESS_MODULES = (
    "tests/cli/test_processes.py",
    "tests/contract/test_middleware_processes.py",
    "tests/contract/test_schedule_processes.py",
    "tests/contract/test_workflow_processes.py",
    "tests/drivers/database/test_reliability.py",
    "tests/drivers/kafka/test_kafka_reliability.py",
    "tests/drivers/redis/test_reliability.py",
    "tests/drivers/sqs/test_crashes.py",
    "tests/drivers/sqs/test_reliability.py",
)


#: Fixtures that start servers of the run's own (a Redis Cluster, sentinels), and
#: the parameters (contract harnesses, lock stores) that are on them: their tests
#: share one xdist worker, so one cluster and one sentinel group serve them all.
TOPOLOGY_FIXTURES = {"redis_cluster_url", "redis_sentinel_url", "sentinel_group"}
TOPOLOGY_HARNESSES = {"redis_cluster"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = pathlib.Path(__file__).parent
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if where in PROCESS_MODULES or item.get_closest_marker("processes") is not None:
            item.add_marker(pytest.mark.xdist_group("processes"))
        elif TOPOLOGY_FIXTURES & set(getattr(item, "fixturenames", ())) or any(
            isinstance(value, str) and value in TOPOLOGY_HARNESSES
            for value in getattr(getattr(item, "callspec", None), "params", {}).values()
        ):
            item.add_marker(pytest.mark.xdist_group("redis-topologies"))
