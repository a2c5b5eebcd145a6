"""Booting: from ``QUEUE_DRIVER`` or a section to a :class:`QueueManager`,
every check passed before the first connection is opened."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ConfigurationError, DriverUnavailableError
from .connections import ConnectionConfig, Connections, _as_connections
from .schema import _CLASS, _EXTRA

if TYPE_CHECKING:
    from ..container import Container
    from ..drivers.base import BaseQueue
    from ..locks.base import LockStore
    from ..manager import QueueManager
    from ..registry import JobRegistry

__all__ = ["QueueResources", "boot_from_env", "boot_from_config"]


@dataclass
class QueueResources:
    """What a configuration file cannot hold.

    - ``registry`` and ``container``: what ``sync`` runs jobs with (and every
      worker; the boot's own ``registry=``/``container=`` arguments do the same).
    - ``database``: the application's database URL, for ``database``
      connections (else ``DATABASE_URL``).
    - ``locks``: a shared lock store, required by ``kafka`` and used by unique
      jobs on every connection.
    """

    registry: JobRegistry | None = None
    container: Container | None = None
    database: Any = None
    locks: LockStore | None = None


# -- booting ------------------------------------------------------------------------------------


def boot_from_env(
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    resources: QueueResources | None = None,
    environ: Mapping[str, str] | None = None,
) -> QueueManager:
    """Boot from ``QUEUE_DRIVER`` and the settings beside it; unset, the manager
    has no connection and dispatching raises ``NoQueueConfiguredError``."""
    connections = Connections.from_env(environ)
    return _boot(connections, registry=registry, container=container, resources=resources, environ=environ)


def boot_from_config(
    config: Any,
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    resources: QueueResources | None = None,
    environ: Mapping[str, str] | None = None,
) -> QueueManager:
    """Boot from a ``queues`` section (dict, JSON/TOML path or :class:`Connections`).

    ``QUEUE_DRIVER`` set beside a section fails the boot; with no section it is
    booted from instead."""
    connections = _as_connections(config)
    env = os.environ if environ is None else environ
    queue_driver = env.get("QUEUE_DRIVER", "").strip()
    if len(connections) and queue_driver and not connections._from_environment:
        raise ConfigurationError(
            f"QUEUE_DRIVER={queue_driver} and a queues section are both set; each names the default connection, "
            "and a job dispatched to the one that lost would wait where nothing drains it. Remove one"
        )
    if not len(connections) and connections.default is None:
        connections = Connections.from_env(env)
    return _boot(connections, registry=registry, container=container, resources=resources, environ=environ)


def _one(what: str, given: Any, resource: Any) -> Any:
    if given is not None and resource is not None and given is not resource:
        raise ConfigurationError(
            f"two different {what} objects were given (the {what}= argument and QueueResources.{what}); give one"
        )
    return given if given is not None else resource


def _boot(
    connections: Connections,
    *,
    registry: JobRegistry | None,
    container: Container | None,
    resources: QueueResources | None,
    environ: Mapping[str, str] | None,
) -> QueueManager:
    from ..manager import QueueManager, set_instance

    connections._check_default()
    resources = resources or QueueResources()
    registry = _one("registry", registry, resources.registry)
    container = _one("container", container, resources.container)
    env = os.environ if environ is None else environ
    # Everything a connection needs is resolved before the first one is opened.
    plans: list[tuple[ConnectionConfig, dict[str, Any]]] = []
    for config in connections:
        plans.append((config, _needs(config, registry, container, resources, env)))
    drivers: dict[str, BaseQueue] = {}
    try:
        for config, needs in plans:
            drivers[config.name] = _build(config, needs)
        manager = QueueManager(
            connections=drivers,
            default=connections.default_name,
            registry=registry,
            container=container,
            locks=resources.locks,
        )
    except BaseException:
        for driver in drivers.values():
            try:
                driver.close()
            except Exception:  # noqa: BLE001 - the boot error is the one to report
                pass
        raise
    set_instance(manager)
    return manager


def _needs(
    config: ConnectionConfig,
    registry: JobRegistry | None,
    container: Container | None,
    resources: QueueResources,
    env: Mapping[str, str],
) -> dict[str, Any]:
    where = config.where()
    if config.driver == "sync":
        if registry is None:
            raise ConfigurationError(
                f"{where}: sync runs jobs inline and needs the job registry; pass registry= or "
                "QueueResources(registry=...)"
            )
        if container is None:
            raise ConfigurationError(
                f"{where}: sync runs jobs inline and needs the container; pass container= or "
                "QueueResources(container=...)"
            )
        return {"registry": registry, "container": container}
    if config.driver == "kafka":
        if resources.locks is None:
            raise ConfigurationError(
                f"{where}: kafka needs a shared lock store for its job leases; give QueueResources(locks=...), "
                "e.g. RedisLockStore.from_url(...) or DatabaseLockStore.from_url(...)"
            )
        return {"locks": resources.locks}
    if config.driver == "database":
        url = resources.database
        label = "QueueResources.database"
        if url is None:
            url, label = env.get("DATABASE_URL", "").strip(), "DATABASE_URL"
            if not url:
                raise ConfigurationError(
                    f"{where}: DATABASE_URL is not set (nor QueueResources.database); set it to sqlite:///path "
                    "or postgresql://user@host/db"
                )
        if not isinstance(url, str) or "://" not in url:
            raise ConfigurationError(
                f"{where}: {label} must be a database URL such as sqlite:///jobs.db or "
                f"postgresql://user@host/db, got {url!r}"
            )
        return {"url": url}
    return {}


def _driver_class(config: ConnectionConfig, extra: str) -> Any:
    module = f"rainier_sync.drivers.{config.driver}"
    try:
        return getattr(importlib.import_module(module), _CLASS[config.driver])
    except AttributeError as exc:
        raise ConfigurationError(
            f"{config.where()}: the {config.driver} driver is not part of this installation of rainier_sync"
        ) from exc
    except DriverUnavailableError as exc:
        raise ConfigurationError(f"{config.where()}: {exc}") from exc
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing == module or missing.startswith("rainier_sync"):
            raise ConfigurationError(
                f"{config.where()}: the {config.driver} driver is not part of this installation of rainier_sync"
            ) from exc
        raise ConfigurationError(
            f"{config.where()}: the {config.driver} driver needs {missing or 'a missing package'}; "
            f"install it with: pip install 'rainier_sync[{extra}]'"
        ) from exc


def _database_extra(url: str) -> str:
    scheme = url.split("://", 1)[0].lower()
    return "mysql" if scheme.startswith(("mysql", "mariadb")) else "postgres"


def _build(config: ConnectionConfig, needs: dict[str, Any]) -> BaseQueue:
    settings = dict(config.settings)
    driver = config.driver
    if driver == "sync":
        from ..drivers.sync import SyncQueue

        return SyncQueue(needs["registry"], needs["container"])
    if driver == "memory":
        from ..drivers.memory import MemoryQueue

        return MemoryQueue(**settings)
    extra = _database_extra(needs["url"]) if driver == "database" else _EXTRA[driver]
    cls = _driver_class(config, extra)
    try:
        if driver == "database":
            return cls.from_url(needs["url"], **settings)  # type: ignore[no-any-return]
        if driver == "redis":
            return cls.from_url(settings.pop("url"), **settings)  # type: ignore[no-any-return]
        if driver == "kafka":
            return cls(**settings, locks=needs["locks"])  # type: ignore[no-any-return]
        return cls(**settings)  # type: ignore[no-any-return]
    except DriverUnavailableError as exc:
        hint = "" if "pip install" in str(exc) else f"; install it with: pip install 'rainier_sync[{extra}]'"
        raise ConfigurationError(f"{config.where()}: {exc}{hint}") from exc
    except (ValueError, TypeError) as exc:
        # The driver's own check, named after the connection it refused.
        raise ConfigurationError(f"{config.where()}: {exc}") from exc
