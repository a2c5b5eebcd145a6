"""A driver from outside the package: it registers a spec, names itself and
declares its promises, and configuration, the command line and the worker
treat it as they treat the six shipped drivers."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterator

import pytest

from rainier_sync import JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.cli import main
from rainier_sync.drivers import MemoryQueue
from rainier_sync.drivers import spec as specs
from rainier_sync.drivers.base import Promises
from rainier_sync.drivers.spec import DriverSpec, Setting, seconds
from rainier_sync.errors import ConfigurationError

from .conftest import Ping


class AcmeQueue(MemoryQueue):
    """Stands in for a driver published elsewhere: it is none of the six."""

    driver = None
    promises = Promises(deferred=True, survives_a_restart=False)

    @property
    def kind(self) -> str:
        return "acme"


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> AcmeQueue:
    return AcmeQueue(reservation=settings.get("reservation", 60))


@pytest.fixture
def acme() -> Iterator[DriverSpec]:
    spec = specs.register_driver(
        DriverSpec(
            name="acme",
            build=_build,
            settings={"reservation": Setting(seconds(), env=("ACME_RESERVATION",))},
            period="reservation",
            default_period=60,
            rank=50,
        )
    )
    yield spec
    specs._specs.pop("acme", None)


def test_a_registered_driver_boots_from_a_section_and_from_the_environment(
    acme: DriverSpec, registry: JobRegistry
) -> None:
    manager = QueueManager.from_config(
        {"connections": {"jobs": {"driver": "acme", "reservation": 45}}}, registry=registry, environ={}
    )
    driver = manager.connection("jobs")
    assert isinstance(driver, AcmeQueue) and driver.reservation == 45 and driver.kind == "acme"
    assert "acme" in specs.driver_names()

    from_env = QueueManager.from_env(registry=registry, environ={"QUEUE_DRIVER": "acme", "ACME_RESERVATION": "30"})
    assert from_env.connection("acme").reservation == 30


def test_a_registered_driver_refuses_keys_it_does_not_declare(acme: DriverSpec, registry: JobRegistry) -> None:
    with pytest.raises(ConfigurationError, match="reservaton"):
        QueueManager.from_config({"connections": {"jobs": {"driver": "acme", "reservaton": 45}}}, registry=registry)


def test_a_second_spec_under_a_taken_name_is_refused(acme: DriverSpec) -> None:
    with pytest.raises(ValueError, match="'acme' is already registered"):
        specs.register_driver(DriverSpec(name="acme", build=_build))


#: The manager ``--app tests.config.test_third_party:current`` finds.
current: QueueManager | None = None


def test_the_worker_and_the_command_line_read_its_promises_not_its_name(
    acme: DriverSpec, registry: JobRegistry, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = QueueManager.from_config({"connections": {"jobs": {"driver": "acme"}}}, registry=registry, environ={})
    monkeypatch.setattr(sys.modules[__name__], "current", manager)
    manager.dispatch(Ping(n=3))
    app = f"--app={__name__}:current"

    assert main(["queue:status", app, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status[0]["driver"] == "acme" and status[0]["queues"]["default"]["ready"] == 1

    seen: list[int] = []
    manager.container.instance("seen", seen)
    monkeypatch.setattr("rainier_sync.worker.Worker.install_signal_handlers", lambda self: None)
    assert main(["queue:work", app, "--once"]) == 0
    assert seen == [3]
    stats = Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    assert stats.processed == 0
