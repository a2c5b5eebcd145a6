"""What a driver declares about itself, beside its classes: a :class:`DriverSpec`.

Configuration, booting, the command line and the error for a missing extra
read the specs, so a driver's name, settings, environment variables,
refusals and how it is built are spelt in one place: its own package. A
third-party driver registers its spec with :func:`register_driver`.

A spec module imports nothing optional: building the driver (which imports
its client library) happens only in :attr:`DriverSpec.build`.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .promises import Promises

if TYPE_CHECKING:
    from ..container import Container
    from ..registry import JobRegistry
    from ..state.base import LockStore
    from .base import BaseQueue

__all__ = [
    "DriverSpec",
    "Setting",
    "Kind",
    "Bad",
    "BootContext",
    "Declared",
    "QUEUE_DECOY",
    "OUTBOX",
    "register_driver",
    "driver_spec",
    "driver_names",
    "seconds",
    "duration",
    "millis",
    "count",
    "flag",
    "text",
    "url",
]


# -- the kinds of value a setting takes --------------------------------------------------


class Bad(Exception):
    """A value does not fit its setting; the message completes "<label> ..."."""


@dataclass(frozen=True)
class Kind:
    """How a setting's value is checked, and read from an environment variable."""

    check: Callable[[Any], Any]
    from_text: Callable[[str], Any] = str


def _int_text(value: str) -> Any:
    try:
        return int(value.strip())
    except ValueError:
        return value  # check() refuses it, quoting what was written


def _whole(minimum: int, maximum: int | None, unit: str) -> Callable[[Any], Any]:
    """Integers of ``unit`` (``""`` for a plain count) from ``minimum`` to ``maximum``."""
    what, of = (f"whole {unit}", f" {unit}") if unit else ("a whole number", "")

    def check(value: Any) -> int:
        if isinstance(value, timedelta) and unit == "seconds":
            value = value.total_seconds()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise Bad(f"must be {what} (an integer), got {value!r}")
        if value < 0:
            raise Bad(f"must not be negative, got {value}")
        if value < minimum:
            raise Bad(f"must be at least {minimum}{of}, got {value}")
        if maximum is not None and value > maximum:
            raise Bad(f"must be at most {maximum}{of}, got {value}")
        return value

    return check


def seconds(minimum: int = 1, maximum: int | None = None) -> Kind:
    """Whole seconds (a ``timedelta`` too)."""
    return Kind(_whole(minimum, maximum, "seconds"), _int_text)


def millis() -> Kind:
    """Whole milliseconds, at least 1."""
    return Kind(_whole(1, None, "milliseconds"), _int_text)


def duration(minimum: float = 0.0) -> Kind:
    """Seconds, whole or not (a ``timedelta`` too), at least ``minimum``."""

    def check(value: Any) -> float:
        if isinstance(value, timedelta):
            value = value.total_seconds()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise Bad(f"must be a number of seconds, got {value!r}")
        if value < minimum or value == float("inf"):
            raise Bad(f"must be at least {minimum:g} seconds and finite, got {value!r}")
        return float(value)

    def from_text(written: str) -> Any:
        try:
            return float(written.strip())
        except ValueError:
            return written

    return Kind(check, from_text)


def count() -> Kind:
    """A whole number, 0 or more."""
    return Kind(_whole(0, None, ""), _int_text)


def _check_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Bad(f"must be true or false, got {value!r}")
    return value


def _flag_text(value: str) -> Any:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    return words.get(value.strip().lower(), value)


def flag() -> Kind:
    """True or false (``true/1/yes``, ``false/0/no`` in the environment)."""
    return Kind(_check_flag, _flag_text)


def text(allow_empty: bool = False) -> Kind:
    """A string (not blank unless ``allow_empty``)."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Bad(f"must be a string, got {value!r}")
        if not allow_empty and not value.strip():
            raise Bad("must not be empty")
        return value

    return Kind(check)


def url(schemes: tuple[str, ...], example: str) -> Kind:
    """A URL with one of ``schemes``."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Bad(f"must be a URL such as {example}, got {value!r}")
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in schemes:
            starts = " or ".join(s + "://" for s in schemes)
            raise Bad(f"must be a URL starting {starts} (e.g. {example}), got {value!r}")
        return value

    return Kind(check, lambda written: written.strip())


# -- a driver's declaration -------------------------------------------------------------------

#: Why a queue named on a connection is refused, and what to write instead.
QUEUE_DECOY = (
    "the queue is the job's to name, so a queue on a connection would be a decoy nothing reads",
    "QUEUE on the job class, manager.dispatch_on(queue, job), and queue:work --queue=a,b",
)


@dataclass(frozen=True)
class Setting:
    """One setting a driver takes: its kind, the environment variables it is read
    from under ``QUEUE_DRIVER`` (the first set wins), and whether it is required
    (``required`` is then the reason given when it is missing, or ``""``)."""

    kind: Kind
    env: tuple[str, ...] = ()
    required: str | None = None


#: The setting of a driver that cannot write in the caller's transaction: ``outbox =
#: true`` sends its dispatches ``.within(conn)`` through the outbox in the
#: application's database (``QueueResources(database=url)`` or ``DATABASE_URL``).
#: Configuration takes it out before the driver is built: it is the manager's.
OUTBOX = Setting(flag(), env=("QUEUE_OUTBOX",))


@dataclass(frozen=True)
class Declared:
    """One checked connection as a driver's checks see it: its settings, and how
    to name the connection or one of its settings in an error."""

    settings: Mapping[str, Any]
    where: Callable[[str | None], str]
    label: Callable[[str], str]


@dataclass
class BootContext:
    """What a configuration cannot hold, offered to a driver being built."""

    registry: JobRegistry | None = None
    container: Container | None = None
    locks: LockStore | None = None
    database: Any = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DriverSpec:
    """Everything configuration needs to know about one driver.

    - ``name``: what ``driver =`` and ``QUEUE_DRIVER`` say.
    - ``settings``: the keys a declaration may hold.
    - ``period`` / ``default_period``: the setting that is this driver's
      reservation (``None`` for a driver that reserves nothing) and its default.
    - ``refusals``: keys refused with why and what to write instead (checked
      before the refusals every driver shares); ``env_refused`` the same for
      environment variables under ``QUEUE_DRIVER``.
    - ``check``: settings refused for what they mean together.
    - ``prepare``: resolves and checks what the driver needs beyond its settings
      (a registry, a lock store, a database URL) before any connection opens;
      it is given the connection's description for errors.
    - ``build``: makes the driver from its settings and what ``prepare`` gave.
    - ``extra``: the ``pip install 'rainier_sync[extra]'`` its client comes with.

    - ``promises``: what the driver promises about the jobs it accepts; its
      class's :attr:`~rainier_sync.drivers.base.BaseQueue.promises` is this one,
      and :class:`~rainier_sync.drivers.promises.QueueDriver` answers from it.
    """

    name: str
    build: Callable[[dict[str, Any], dict[str, Any]], BaseQueue]
    settings: Mapping[str, Setting] = field(default_factory=dict)
    period: str | None = None
    default_period: float | None = None
    refusals: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    env_refused: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    check: Callable[[Declared], None] | None = None
    prepare: Callable[[str, BootContext], dict[str, Any]] | None = None
    extra: str | None = None
    #: Where it comes in lists of drivers (lower first).
    rank: int = 100
    promises: Promises = field(default_factory=Promises)

    def required(self) -> list[str]:
        return [key for key, setting in self.settings.items() if setting.required is not None]


_specs: dict[str, DriverSpec] = {}
_lock = threading.Lock()
_discovered = False


def register_driver(spec: DriverSpec) -> DriverSpec:
    """Make ``spec`` known to configuration under ``spec.name``; returns it."""
    with _lock:
        known = _specs.get(spec.name)
        if known is not None and known is not spec:
            raise ValueError(f"a driver named {spec.name!r} is already registered")
        _specs[spec.name] = spec
    return spec


def _discover() -> None:
    """Load the specs of the drivers shipped in this package: each module or
    package under ``rainier_sync.drivers`` that declares a ``SPEC``."""
    global _discovered
    if _discovered:
        return
    package = importlib.import_module(__package__ or "rainier_sync.drivers")
    for found in pkgutil.iter_modules(package.__path__):
        if found.name in ("base", "spec") or found.name.startswith("_"):
            continue
        module = f"{package.__name__}.{found.name}" + (".spec" if found.ispkg else "")
        spec = getattr(importlib.import_module(module), "SPEC", None)
        if isinstance(spec, DriverSpec):
            register_driver(spec)
    _discovered = True


def driver_spec(name: str) -> DriverSpec | None:
    """The spec registered as ``name``, or None."""
    _discover()
    return _specs.get(name)


def driver_names() -> list[str]:
    """Every registered driver's name, in the order their specs rank them."""
    _discover()
    return sorted(_specs, key=lambda name: (_specs[name].rank, name))
