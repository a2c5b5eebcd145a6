"""Booting the manager from Django settings, with the rules of the
configuration page: ``QUEUE_DRIVER`` (and the settings beside it, read from
Django's settings) or ``RAINIER_QUEUES``; both set, neither set, a misspelt
``RAINIER_*`` setting, a ``DATABASES`` alias that does not exist: each an
:class:`~django.core.exceptions.ImproperlyConfigured` naming the setting."""

from __future__ import annotations

import copy
import importlib
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping

from django.core.exceptions import ImproperlyConfigured

from ..config import QueueResources
from ..config.boot import Booted, build_from_config, build_from_env
from ..config.schema import suggest
from ..container import Container
from ..errors import ConfigurationError, RainierError
from ..jobs import Job
from ..registry import JobRegistry

__all__ = ["boot", "SETTINGS", "Route", "database_url", "discover_jobs"]

SECTION = "RAINIER_QUEUES"
DRIVER = "QUEUE_DRIVER"

#: Every ``RAINIER_*`` setting of this integration (the dashboard's included);
#: any other ``RAINIER_*`` setting is refused as misspelt.
SETTINGS: frozenset[str] = frozenset(
    {
        SECTION,
        "RAINIER_JOBS",
        "RAINIER_ON_COMMIT",
        "RAINIER_DASHBOARD_AUTHORIZE",
    }
)

#: The ``DATABASES`` engines a ``database`` connection can keep its jobs in.
_ENGINES = {
    "django.db.backends.sqlite3": "sqlite",
    "django.db.backends.postgresql": "postgresql",
    "django.db.backends.mysql": "mysql",
}


@dataclass(frozen=True)
class Route:
    """How a dispatch to one connection goes out under Django.

    ``alias``: the ``DATABASES`` entry a ``database`` connection keeps its
    jobs in (written on the calling thread's Django connection). ``outbox``:
    the alias of the outbox's database, for a connection declared with
    ``outbox = true``. Neither: sent at ``on_commit`` inside ``atomic()``.
    """

    alias: str | None = None
    outbox: str | None = None
    #: Whether the driver runs the job inside ``dispatch`` (``sync``): never deferred.
    inline: bool = False
    #: The connection's checked settings (a database connection is rebuilt from them
    #: when Django's connection to its alias moves to another database: a test database).
    settings: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class Plan:
    """What :func:`boot` read from the settings."""

    routes: dict[str, Route] = field(default_factory=dict)
    on_commit: bool = True
    #: The default connection's name.
    default: str | None = None


def _setting(settings: Any, name: str, default: Any = None) -> Any:
    return getattr(settings, name, default)


def _names(settings: Any) -> list[str]:
    return [name for name in dir(settings) if name.isupper()]


def check_rainier_settings(settings: Any) -> None:
    """Refuse a ``RAINIER_*`` setting nobody reads (a misspelling)."""
    known = sorted(SETTINGS)
    for name in _names(settings):
        if name.startswith("RAINIER_") and name not in SETTINGS:
            raise ImproperlyConfigured(
                f"settings.{name} is not a rainier_sync setting{suggest(name, known)} (it reads: {', '.join(known)})"
            )
    on_commit = _setting(settings, "RAINIER_ON_COMMIT", True)
    if not isinstance(on_commit, bool):
        raise ImproperlyConfigured(f"settings.RAINIER_ON_COMMIT must be True or False, got {on_commit!r}")


def database_url(alias: str, databases: Mapping[str, Any], where: str) -> str:
    """The URL of ``DATABASES[alias]`` as the database driver reads it; ``where``
    names the setting that asked, in errors."""
    if not isinstance(alias, str) or alias not in databases:
        declared = sorted(str(name) for name in databases)
        raise ImproperlyConfigured(
            f"{where}: alias {alias!r} is not in settings.DATABASES{suggest(str(alias), declared)} "
            f"(declared: {', '.join(declared) or 'none'})"
        )
    entry = databases[alias]
    engine = str(entry.get("ENGINE", ""))
    dialect = _ENGINES.get(engine)
    if dialect is None:
        raise ImproperlyConfigured(
            f"{where}: DATABASES[{alias!r}] uses the engine {engine!r}; the database driver keeps its jobs in "
            f"{', '.join(sorted(_ENGINES))} databases"
        )
    name = str(entry.get("NAME") or "")
    if dialect == "sqlite":
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ImproperlyConfigured(
                f"{where}: DATABASES[{alias!r}] is an in-memory SQLite database, which no worker process can "
                "share; give it a file NAME"
            )
        return "sqlite:///" + os.path.abspath(name)
    if not name:
        raise ImproperlyConfigured(f"{where}: DATABASES[{alias!r}] has no NAME")
    user = urllib.parse.quote(str(entry.get("USER") or ""), safe="")
    password = urllib.parse.quote(str(entry.get("PASSWORD") or ""), safe="")
    host = str(entry.get("HOST") or ("127.0.0.1" if dialect == "mysql" else "localhost"))
    if host.startswith("/"):
        raise ImproperlyConfigured(
            f"{where}: DATABASES[{alias!r}] connects through the socket directory {host}; the database driver "
            "needs a TCP HOST"
        )
    port = str(entry.get("PORT") or "")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    netloc = f"{credentials}{host}:{port}" if port else f"{credentials}{host}"
    return f"{dialect}://{netloc}/{urllib.parse.quote(name, safe='')}"


def _environ(settings: Any) -> dict[str, str]:
    """The settings as the string environment ``QUEUE_DRIVER`` and its siblings are read from."""
    environ: dict[str, str] = {}
    for name in _names(settings):
        if name.startswith("RAINIER_") or name == "DATABASE_URL":
            continue
        try:
            value = getattr(settings, name)
        except ImproperlyConfigured:  # a setting Django itself refuses to read (an empty SECRET_KEY)
            continue
        if isinstance(value, bool):
            environ[name] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            environ[name] = str(value)
    return environ


# -- the jobs ------------------------------------------------------------------------------------


def _jobs_in(module: Any) -> list[type[Job]]:
    """The Job classes (function jobs too) defined in ``module`` or a submodule of it."""
    prefix = module.__name__
    found: list[type[Job]] = []
    for value in list(vars(module).values()):
        if not isinstance(value, type) or not issubclass(value, Job) or value in found:
            continue
        home = getattr(value, "__module__", "")
        if (home == prefix or home.startswith(prefix + ".")) and getattr(value, "NAME", None):
            found.append(value)
    return found


def discover_jobs(settings: Any, registry: JobRegistry) -> list[str]:
    """Register the jobs of each installed app's ``jobs`` module, or of the
    modules ``RAINIER_JOBS`` lists; returns the modules read."""
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    listed = _setting(settings, "RAINIER_JOBS")
    modules: list[str] = []
    if listed is not None:
        if isinstance(listed, str) or not isinstance(listed, (list, tuple)):
            raise ImproperlyConfigured(
                f"settings.RAINIER_JOBS must be a list of module paths, e.g. ['shop.jobs'], got {listed!r}"
            )
        for path in listed:
            if not isinstance(path, str) or not path:
                raise ImproperlyConfigured(f"settings.RAINIER_JOBS: {path!r} is not a module path")
            try:
                importlib.import_module(path)
            except ImportError as exc:
                raise ImproperlyConfigured(f"settings.RAINIER_JOBS: cannot import {path!r}: {exc}") from exc
            modules.append(path)
    else:
        for app in apps.get_app_configs():
            if app.module is not None and module_has_submodule(app.module, "jobs"):
                modules.append(f"{app.name}.jobs")
    for path in modules:
        module = importlib.import_module(path)
        for cls in _jobs_in(module):
            if registry.find(cls.NAME) is cls:
                continue
            try:
                registry.register(cls)
            except RainierError as exc:
                raise ImproperlyConfigured(f"{path}: {exc}") from exc
    return modules


# -- the connections -----------------------------------------------------------------------------


def _section(settings: Any) -> dict[str, Any]:
    section = _setting(settings, SECTION)
    if isinstance(section, (str, os.PathLike)):
        from pathlib import Path

        from ..config.connections import _read_file

        try:
            section, _ = _read_file(Path(section))
        except ConfigurationError as exc:
            raise ImproperlyConfigured(f"settings.{SECTION}: {exc}") from exc
    if not isinstance(section, Mapping):
        raise ImproperlyConfigured(
            f"settings.{SECTION} must be a queues section, e.g. "
            '{"connections": {"main": {"driver": "database", "alias": "default"}}}, '
            f"or the path of a JSON/TOML file holding one; got {section!r}"
        )
    section = copy.deepcopy(dict(section))
    if "queues" in section and isinstance(section["queues"], Mapping):
        section = dict(section["queues"])
    return section


def _boot_section(
    settings: Any, registry: JobRegistry, container: Container, environ: dict[str, str]
) -> tuple[Booted, Plan]:
    section = _section(settings)
    databases: Mapping[str, Any] = _setting(settings, "DATABASES", {}) or {}
    connections = section.get("connections")
    aliases: dict[str, str] = {}
    if isinstance(connections, Mapping):
        connections = {name: dict(decl) if isinstance(decl, Mapping) else decl for name, decl in connections.items()}
        section["connections"] = connections
        for name, declaration in connections.items():
            if not isinstance(declaration, dict) or "alias" not in declaration:
                if isinstance(declaration, dict) and str(declaration.get("driver", "")).strip().lower() == "database":
                    aliases[str(name)] = "default"
                continue
            where = f"settings.{SECTION}['connections'][{name!r}]"
            driver = str(declaration.get("driver", "")).strip().lower()
            if driver != "database":
                raise ImproperlyConfigured(
                    f"{where}: 'alias' names a DATABASES entry, which only the database driver keeps its jobs in; "
                    f"this connection's driver is {declaration.get('driver')!r}: remove 'alias'"
                )
            aliases[str(name)] = declaration.pop("alias")
    try:
        from ..config.connections import Connections

        checked = Connections.from_dict(section)
    except ConfigurationError as exc:
        raise ImproperlyConfigured(f"settings.{SECTION}: {exc}") from exc
    plan = Plan(on_commit=_setting(settings, "RAINIER_ON_COMMIT", True))
    groups: dict[str | None, dict[str, Any]] = {}
    for config in checked:
        alias = aliases.get(config.name)
        if alias is not None:
            database_url(alias, databases, f"settings.{SECTION}['connections'][{config.name!r}]")
        groups.setdefault(alias, {})[config.name] = connections[config.name]  # type: ignore[index]
    outbox_alias = "default"
    parts: list[Booted] = []
    try:
        for alias, declared in groups.items():
            wants_outbox = alias is None and any(decl.get("outbox") for decl in declared.values())
            if alias is not None:
                url: str | None = database_url(alias, databases, f"settings.{SECTION}")
            elif wants_outbox:
                url = database_url(outbox_alias, databases, f"settings.{SECTION} (outbox = true)")
            else:
                url = None
            part_section: dict[str, Any] = {"default": next(iter(declared)), "connections": declared}
            if not parts and section.get("locks") is not None:
                part_section["locks"] = section["locks"]  # one store for the whole section, built once
            booted = build_from_config(
                part_section,
                resources=QueueResources(registry=registry, container=container, database=url),
                environ={key: value for key, value in environ.items() if key != DRIVER},
            )
            parts.append(booted)
            for name, decl in declared.items():
                built = booted.connections[name]
                plan.routes[name] = Route(
                    alias=alias,
                    outbox=outbox_alias if decl.get("outbox") else None,
                    inline=not built.promises.deferred,
                    settings=dict(checked[name].settings),
                )
    except ConfigurationError as exc:
        for part in parts:
            part.close()
        raise ImproperlyConfigured(f"settings.{SECTION}: {exc}") from exc
    merged = Booted({}, checked.default_name, registry, container, parts[0].locks if parts else None)
    merged.owns_locks = bool(parts) and parts[0].owns_locks
    for config in checked:
        for part in parts:
            if config.name in part.connections:
                merged.connections[config.name] = part.connections[config.name]
    for part in parts:
        if part.outbox is not None:
            merged.outbox = part.outbox
    return merged, plan


def _boot_env(
    settings: Any, registry: JobRegistry, container: Container, environ: dict[str, str]
) -> tuple[Booted, Plan]:
    driver = str(environ.get(DRIVER, "")).strip().lower()
    plan = Plan(on_commit=_setting(settings, "RAINIER_ON_COMMIT", True))
    url = None
    if driver == "database":
        url = database_url("default", _setting(settings, "DATABASES", {}) or {}, f"settings.{DRIVER}=database")
    try:
        booted = build_from_env(
            resources=QueueResources(registry=registry, container=container, database=url), environ=environ
        )
    except ConfigurationError as exc:
        raise ImproperlyConfigured(f"settings: {exc}") from exc
    for name, queue in booted.connections.items():
        plan.routes[name] = Route(
            alias="default" if driver == "database" else None,
            inline=not queue.promises.deferred,
            settings=dict(checked_settings(environ, name)),
        )
    return booted, plan


def uses_tasks_backend(settings: Any) -> bool:
    """Whether ``TASKS`` names a backend of this package (``TasksBackend``)."""
    tasks = _setting(settings, "TASKS")
    if not isinstance(tasks, Mapping):
        return False
    return any(
        isinstance(entry, Mapping) and str(entry.get("BACKEND", "")).startswith("rainier_sync.django.")
        for entry in tasks.values()
    )


def discover_tasks(registry: JobRegistry) -> list[str]:
    """Register the job class of every task defined in an installed app's
    ``tasks`` module whose backend is a :class:`~rainier_sync.django.tasks.TasksBackend`;
    returns their names."""
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    from .tasks import FRAMEWORK, TasksBackend, job_class_for

    framework = importlib.import_module(FRAMEWORK)
    task_class = importlib.import_module(f"{FRAMEWORK}.base").Task
    found: list[str] = []
    for app in apps.get_app_configs():
        if app.module is None or not module_has_submodule(app.module, "tasks"):
            continue
        module = importlib.import_module(f"{app.name}.tasks")
        for value in list(vars(module).values()):
            if not isinstance(value, task_class):
                continue
            backend = framework.task_backends[value.backend]
            if not isinstance(backend, TasksBackend):
                continue
            cls = job_class_for(value, backend.keep_result)
            if registry.find(cls.NAME) is not cls:
                registry.register(cls)
            found.append(cls.NAME)
    return found


def checked_settings(environ: dict[str, str], name: str) -> dict[str, Any]:
    from ..config.connections import Connections

    return dict(Connections.from_env(environ)[name].settings)


def boot(
    settings: Any = None,
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    discover: bool = True,
) -> Any:
    """The :class:`~rainier_sync.django.DjangoQueueManager` the settings
    describe (default: ``django.conf.settings``), its jobs discovered.

    Raises :class:`~django.core.exceptions.ImproperlyConfigured` naming the
    setting at fault."""
    from .dispatching import DjangoQueueManager

    if settings is None:
        from django.conf import settings as django_settings

        settings = django_settings
    check_rainier_settings(settings)
    registry = registry if registry is not None else JobRegistry()
    container = container if container is not None else Container()
    section = _setting(settings, SECTION)
    driver = _setting(settings, DRIVER)
    if section is not None and driver is not None:
        raise ImproperlyConfigured(
            f"settings.{DRIVER} and settings.{SECTION} are both set; each names the default connection, and a job "
            "dispatched to the one that lost would wait where nothing drains it. Keep one of the two"
        )
    if section is None and driver is None:
        raise ImproperlyConfigured(
            f"rainier_sync.django is installed and no queue is configured: set settings.{SECTION} "
            '(e.g. {"connections": {"main": {"driver": "database", "alias": "default"}}}) '
            f"or settings.{DRIVER} (e.g. 'database', with the settings beside it)"
        )
    if discover:
        discover_jobs(settings, registry)
    environ = _environ(settings)
    if section is not None:
        booted, plan = _boot_section(settings, registry, container, environ)
    else:
        booted, plan = _boot_env(settings, registry, container, environ)
    try:
        # The store QUEUE_LOCKS_URL or the section's ``locks`` named; else the default's own.
        store: dict[str, Any] = {"locks": booted.locks} if booted.owns_locks else {}
        manager = DjangoQueueManager(
            connections=booted.connections,
            default=booted.default,
            registry=registry,
            container=container,
            outbox=booted.outbox,
            plan=plan,
            **store,
        )
        plan.default = manager.default
    except RainierError as exc:
        booted.close()
        raise ImproperlyConfigured(f"settings: {exc}") from exc
    return manager
