from __future__ import annotations

import threading

import pytest

from rainier_sync import BindingError, Container


class Service:
    closed = 0

    def close(self) -> None:
        Service.closed += 1


def test_instance_singleton_and_scoped() -> None:
    made: list[str] = []
    container = (
        Container()
        .instance("config", {"a": 1})
        .singleton("db", lambda c: made.append("db") or object())
        .scoped(Service, lambda: Service())
    )
    assert container.resolve("config") == {"a": 1}
    assert container.resolve("db") is container.resolve("db")
    assert made == ["db"]
    first = container.resolve(Service)
    assert container.resolve(Service) is first
    Service.closed = 0
    container.flush_scoped()
    assert Service.closed == 1, "flushing closes scoped objects that have close()"
    assert container.resolve(Service) is not first


def test_scoped_objects_are_per_thread() -> None:
    container = Container().scoped("s", lambda: object())
    here = container.resolve("s")
    there: list[object] = []
    thread = threading.Thread(target=lambda: there.append(container.resolve("s")))
    thread.start()
    thread.join(5)
    assert there and there[0] is not here


def test_resolving_an_unbound_key_names_it() -> None:
    class Mailer:
        pass

    with pytest.raises(BindingError, match="Mailer"):
        Container().resolve(Mailer)
    with pytest.raises(BindingError, match="'missing'"):
        Container().resolve("missing")


def test_a_factory_error_is_not_swallowed() -> None:
    def broken(container: Container) -> object:
        raise TypeError("bad wiring")

    with pytest.raises(TypeError, match="bad wiring"):
        Container().singleton("x", broken).resolve("x")
