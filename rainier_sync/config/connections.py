"""Declarations: the ``queues`` section read from a dict, a JSON or TOML file,
the environment, or built in Python with :class:`Connections`."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Mapping

from .._checks import check_number
from ..drivers.spec import Bad, Declared, DriverSpec, driver_names, driver_spec
from ..errors import ConfigurationError
from .schema import refusal, suggest

__all__ = ["Connections", "ConnectionConfig"]


# -- where a declaration came from, for error messages ------------------------------------


class _Source:
    """Names the origin of a declaration in error messages: a file and line, a
    dict, or the environment."""

    def __init__(self, name: str | None = None, text: str | None = None, prefix: tuple[str, ...] = ()) -> None:
        self.name = name
        self.lines = text.splitlines() if text is not None else None
        self.prefix = prefix

    def within(self, *prefix: str) -> _Source:
        inner = _Source(self.name, prefix=self.prefix + prefix)
        inner.lines = self.lines
        return inner

    def at(self, *path: str) -> str:
        if self.name is None:
            return ""
        line = self._line(self.prefix + path)
        return f"{self.name}, line {line}: " if line else f"{self.name}: "

    def _line(self, path: tuple[str, ...]) -> int | None:
        # Best effort: find each key of the path in turn, each at or after the one before.
        if not self.lines:
            return None
        found: int | None = None
        start = 0
        for token in path:
            pattern = re.compile(rf"(?<![\w-]){re.escape(token)}(?![\w-])")
            for index in range(start, len(self.lines)):
                if pattern.search(self.lines[index]):
                    found = start = index
                    break
        return None if found is None else found + 1


_DICT = _Source()


# -- declarations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionConfig:
    """One checked connection: its name, driver and settings. ``labels`` names
    where a setting came from when that was an environment variable."""

    name: str
    driver: str
    settings: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    source: _Source = field(default=_DICT, repr=False, compare=False)

    def label(self, key: str) -> str:
        return self.labels.get(key, key)

    def where(self, key: str | None = None) -> str:
        path = ("connections", self.name) + ((key,) if key else ())
        return f"{self.source.at(*path)}connection {self.name!r} ({self.driver})"

    @property
    def spec(self) -> DriverSpec:
        """The driver's declaration."""
        spec = driver_spec(self.driver)
        assert spec is not None, "a connection is checked against its driver's spec"
        return spec

    def period(self) -> float | None:
        """The reservation-like period in seconds: declared, or the driver's default."""
        spec = self.spec
        key = spec.period
        if key is None:
            return None
        if key in self.settings:
            return float(self.settings[key])
        return float(spec.default_period) if spec.default_period is not None else None


def _check_connection(name: Any, declaration: Any, source: _Source) -> ConnectionConfig:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigurationError(f"{source.at('connections')}connection name {name!r} must be a non-empty word")

    def where() -> str:
        return f"{source.at('connections', name)}connection {name!r}"

    if not isinstance(declaration, Mapping):
        raise ConfigurationError(
            f'{where()}: must be a table of settings with a driver, e.g. {{"driver": "database"}}, got {declaration!r}'
        )
    drivers = driver_names()
    if "driver" not in declaration:
        raise ConfigurationError(
            f"{where()}: has no driver; name one of {', '.join(drivers)} (a connection without a driver "
            "would quietly become whatever a default pointed at)"
        )
    driver = declaration["driver"]
    if not isinstance(driver, str) or driver.strip().lower() not in drivers:
        hint = suggest(driver.strip().lower(), drivers) if isinstance(driver, str) else ""
        raise ConfigurationError(
            f"{source.at('connections', name, 'driver')}connection {name!r}: driver {driver!r} is not one of "
            f"{', '.join(drivers)}{hint}"
        )
    driver = driver.strip().lower()
    spec = driver_spec(driver)
    assert spec is not None
    known = spec.settings
    settings: dict[str, Any] = {}
    for key, value in declaration.items():
        if key == "driver":
            continue
        refused = refusal(spec, str(key))
        if refused is not None:
            why, instead = refused
            problem = f"{key!r} cannot be honoured: {why}. Write instead: {instead}"
        elif key not in known:
            takes = ", ".join(sorted(known)) or "no settings"
            problem = f"unknown setting {key!r}{suggest(str(key), sorted(known))} ({driver} takes: {takes})"
        else:
            try:
                settings[key] = known[key].kind.check(value)
                continue
            except Bad as exc:
                problem = f"{key} {exc}"
        # Where the key is (a file's line) is only looked up for an error.
        raise ConfigurationError(f"{source.at('connections', name, str(key))}connection {name!r} ({driver}): {problem}")
    config = ConnectionConfig(name, driver, settings, source=source)
    _check_together(config)
    return config


def _check_together(config: ConnectionConfig) -> None:
    """Declarations refused for what they mean together: a missing required key,
    and whatever the driver's own check refuses."""
    spec = config.spec
    for key, setting in spec.settings.items():
        if setting.required is not None and key not in config.settings:
            raise ConfigurationError(f"{config.where()}: {config.label(key)} is required and not set{setting.required}")
    if spec.check is not None:
        spec.check(Declared(config.settings, config.where, config.label))


class Connections:
    """The ``queues`` section built in Python, checked as each connection is added.

    Example::

        connections = (
            Connections("primary")
            .with_connection("primary", "database", reservation=120)
            .with_connection("bulk", "sqs", queue_url=BULK_URL, region="us-east-1")
        )
        connections.check_reservations(longest_job_seconds=90)
        manager = QueueManager.from_config(connections, resources=QueueResources(registry=registry))
    """

    def __init__(self, default: str | None = None) -> None:
        if default is not None and (not isinstance(default, str) or not default.strip()):
            raise ConfigurationError(f"default must name a connection, got {default!r}")
        self.default = default
        self._connections: dict[str, ConnectionConfig] = {}
        self._source = _DICT
        self.from_environment = False
        #: The URL of the manager's lock store (the section's ``locks``), or None.
        self.locks: str | None = None
        #: How errors name where :attr:`locks` was written.
        self.locks_label = "locks"

    def with_connection(self, name: str, driver: str, **settings: Any) -> Connections:
        """Declare connection ``name`` on ``driver`` with that driver's own settings."""
        if name in self._connections:
            raise ConfigurationError(f"connection {name!r} is declared twice")
        self._connections[name] = _check_connection(name, {"driver": driver, **settings}, self._source)
        return self

    # -- reading a section --------------------------------------------------------------
    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> Connections:
        """Check a section ``{"default": ..., "connections": {...}}`` (or a mapping
        holding one under ``queues``)."""
        return cls._from_section(section, _DICT)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Connections:
        """Read and check a JSON or TOML file holding a section (at the top level,
        or under a ``queues`` key); errors name the file and line."""
        return cls._from_section(*_read_file(Path(path)))

    @classmethod
    def _from_section(cls, section: Any, source: _Source) -> Connections:
        if not isinstance(section, Mapping):
            raise ConfigurationError(f"{source.at()}the queues section must be a mapping, got {section!r}")
        if "queues" in section:
            source = source.within("queues")
            section = section["queues"]
            if not isinstance(section, Mapping):
                raise ConfigurationError(f"{source.at()}queues must be a mapping, got {section!r}")
        for key in section:
            if key not in ("default", "connections", "locks"):
                hint = suggest(str(key), ["default", "connections", "locks"])
                if key in ("failed", "batching"):
                    hint = "; failed jobs are kept by each connection's own driver, so there is nothing to configure"
                raise ConfigurationError(
                    f"{source.at(str(key))}unknown key {key!r} in the queues section{hint} "
                    "(it takes: default, connections, locks)"
                )
        default = section.get("default")
        connections = section.get("connections", {})
        if not isinstance(connections, Mapping):
            raise ConfigurationError(
                f"{source.at('connections')}connections must map names to declarations, got {connections!r}"
            )
        if default is not None and (not isinstance(default, str) or not default):
            raise ConfigurationError(f"{source.at('default')}default must name a connection, got {default!r}")
        locks = section.get("locks")
        if locks is not None and (not isinstance(locks, str) or "://" not in locks):
            raise ConfigurationError(
                f"{source.at('locks')}locks must be the lock store's URL (redis://..., postgresql://..., "
                f"mysql://... or sqlite:///...), got {locks!r}"
            )
        built = cls(default)
        built._source = source
        built.locks = locks
        built.locks_label = f"{source.at('locks')}locks"
        for name, declaration in connections.items():
            built._connections[name] = _check_connection(name, declaration, source)
        built.check_default()
        return built

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Connections:
        """The one connection ``QUEUE_DRIVER`` declares, named after its driver,
        with its settings from the variables beside it. Empty when unset."""
        env = os.environ if environ is None else environ
        queue_connection = env.get("QUEUE_CONNECTION", "").strip()
        if queue_connection:
            raise ConfigurationError(
                f"QUEUE_CONNECTION={queue_connection} is not read: it is another framework's name for the driver; "
                "write QUEUE_DRIVER instead"
            )
        raw = env.get("QUEUE_DRIVER", "").strip()
        if not raw:
            return cls()
        driver = raw.lower()
        drivers = driver_names()
        spec = driver_spec(driver)
        if spec is None:
            raise ConfigurationError(f"QUEUE_DRIVER={raw} is not one of {', '.join(drivers)}{suggest(driver, drivers)}")
        where = f"QUEUE_DRIVER={driver}: "
        for variable, (why, instead) in spec.env_refused.items():
            if env.get(variable, "").strip():
                raise ConfigurationError(f"{where}{variable} cannot be honoured: {why}. Write instead: {instead}")
        settings: dict[str, Any] = {}
        labels: dict[str, str] = {}
        for key, setting in spec.settings.items():
            if not setting.env:
                continue
            labels[key] = " or ".join(setting.env)
            for variable in setting.env:
                written = env.get(variable, "").strip()
                if written:
                    kind = setting.kind
                    try:
                        settings[key] = kind.check(kind.from_text(written))
                    except (Bad, ValueError) as exc:
                        raise ConfigurationError(f"{where}{variable} {exc}") from None
                    labels[key] = variable
                    break
        built = cls(driver)
        config = ConnectionConfig(driver, driver, settings, labels, _Source(f"QUEUE_DRIVER={driver}"))
        _check_together(config)
        built._connections[driver] = config
        built.from_environment = True
        return built

    def check_default(self) -> None:
        if not self._connections:
            if self.default is not None:
                raise ConfigurationError(
                    f"{self._source.at('default')}default {self.default!r} names a connection nobody declared "
                    "(no connections are declared)"
                )
            return
        names = sorted(self._connections)
        if self.default is None:
            if len(names) > 1:
                raise ConfigurationError(
                    f"{self._source.at('connections')}{len(names)} connections are declared ({', '.join(names)}) "
                    "and no default names one of them; write default"
                )
            return
        if self.default not in self._connections:
            raise ConfigurationError(
                f"{self._source.at('default')}default {self.default!r} names a connection nobody declared "
                f"(declared: {', '.join(names)}){suggest(self.default, names)}"
            )

    # -- reading it back -------------------------------------------------------------------
    def __iter__(self) -> Iterator[ConnectionConfig]:
        return iter(self._connections.values())

    def __len__(self) -> int:
        return len(self._connections)

    def __getitem__(self, name: str) -> ConnectionConfig:
        return self._connections[name]

    @property
    def default_name(self) -> str | None:
        """The default connection: the declared one, or the only one."""
        if self.default is None and len(self._connections) == 1:
            return next(iter(self._connections))
        return self.default

    def to_dict(self) -> dict[str, Any]:
        """The section as a plain dict (what :meth:`from_dict` reads)."""
        section: dict[str, Any] = {}
        if self.default is not None:
            section["default"] = self.default
        section["connections"] = {c.name: {"driver": c.driver, **c.settings} for c in self}
        if self.locks is not None:
            section["locks"] = self.locks
        return section

    def check_reservations(self, longest_job_seconds: float | timedelta) -> Connections:
        """Refuse a reservation (sqs: ``visibility_timeout``, kafka: ``lease``) that
        is not longer than the longest job: a second worker would claim a job
        the first is still running. Undeclared periods are checked at the
        driver's default. Returns ``self``."""
        longest = longest_job_seconds
        if isinstance(longest, timedelta):
            longest = longest.total_seconds()
        check_number("longest_job_seconds", longest, unit="seconds")
        short = []
        for config in self:
            period = config.period()
            key = config.spec.period
            if period is not None and key is not None and period <= longest:
                declared = "" if key in config.settings else " (the driver's default)"
                short.append(
                    f"{config.where(key)}: {config.label(key)} is {period:g}s{declared} but the longest job takes "
                    f"{longest:g}s; set it above that, e.g. {math.ceil(longest * 1.5)}"
                )
        if short:
            raise ConfigurationError(
                "a reservation shorter than the work lets a second worker claim a job the first is still "
                "running: " + "; ".join(short)
            )
        return self

    def __repr__(self) -> str:
        return f"<Connections default={self.default_name!r} {[(c.name, c.driver) for c in self]}>"


# -- files ------------------------------------------------------------------------------------


def _read_file(path: Path) -> tuple[Any, _Source]:
    name = str(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise ConfigurationError(f"{name}: a queues file must be .json or .toml, not {suffix or 'extensionless'}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(f"{name}: queues file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{name}: cannot read the queues file: {exc}") from None
    source = _Source(name, text)
    if not text.strip():
        return {}, source
    if suffix == ".json":
        try:
            return json.loads(text), source
        except json.JSONDecodeError as exc:
            raise ConfigurationError(
                f"{name}, line {exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})"
            ) from None
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.10
        raise ConfigurationError(f"{name}: reading TOML needs Python 3.11 or later; use JSON") from None
    try:
        return tomllib.loads(text), source
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\(at line (\d+), column (\d+)\)", message)
        if found:
            detail = message[: found.start()].strip()
            raise ConfigurationError(
                f"{name}, line {found.group(1)}: not valid TOML: {detail} (column {found.group(2)})"
            ) from None
        raise ConfigurationError(f"{name}: not valid TOML: {message}") from None


def as_connections(config: Any) -> Connections:
    """A :class:`Connections` from what ``from_config`` is given."""
    if config is None:
        return Connections()
    if isinstance(config, Connections):
        return config
    if isinstance(config, (str, os.PathLike)):
        return Connections.load(config)
    if isinstance(config, Mapping):
        return Connections.from_dict(config)
    raise ConfigurationError(
        f"a queues configuration is a dict, a .json/.toml path or Connections, got {type(config).__name__}"
    )
