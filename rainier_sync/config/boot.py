"""Booting: from ``QUEUE_DRIVER`` or a section to built drivers (which
:meth:`QueueManager.from_env` and :meth:`QueueManager.from_config` put a
manager over), every check passed before the first connection is opened."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ..drivers.spec import BootContext
from ..errors import ConfigurationError, DriverUnavailableError, QueueUnavailableError
from .connections import ConnectionConfig, Connections, as_connections

if TYPE_CHECKING:
    from ..container import Container
    from ..drivers.base import BaseQueue
    from ..drivers.database.outbox import Outbox
    from ..registry import JobRegistry
    from ..state.base import LockStore

__all__ = ["QueueResources", "Booted", "build", "build_from_env", "build_from_config", "LOCKS_URL"]


@dataclass
class QueueResources:
    """What a configuration file cannot hold.

    - ``registry`` and ``container``: what ``sync`` runs jobs with (and every
      worker; the boot's own ``registry=``/``container=`` arguments do the same).
    - ``database``: the application's database URL, for ``database``
      connections and for the outbox of connections declared with ``outbox =
      true`` (else ``DATABASE_URL``).
    - ``locks``: a shared lock store, required by ``kafka``, and the manager's
      lock store (unique jobs, paused queues, batches, the workers' records...);
      None: the one in the default connection's own backend, as
      :class:`~rainier_sync.QueueManager` has without ``locks=``.
    """

    registry: JobRegistry | None = None
    container: Container | None = None
    database: Any = None
    locks: LockStore | None = None


# -- booting ------------------------------------------------------------------------------------


@dataclass
class Booted:
    """The drivers a configuration declared, built, with what a manager over them takes."""

    connections: dict[str, BaseQueue]
    default: str | None
    registry: JobRegistry | None
    container: Container | None
    locks: LockStore | None
    #: The outbox of the connections declared with ``outbox = true`` (None when none is).
    outbox: Outbox | None = None

    #: Whether :attr:`locks` was built by the boot (from ``QUEUE_LOCKS_URL`` or the section's ``locks``).
    owns_locks: bool = False

    def close(self) -> None:
        """Close every driver, and the lock store the boot built (the boot failed after they were built)."""
        closing: list[Any] = list(self.connections.values())
        if self.owns_locks and self.locks is not None:
            closing.append(self.locks)
        for each in closing:
            try:
                each.close()
            except Exception:  # noqa: BLE001 - the boot error is the one to report
                pass


def build_from_env(
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    resources: QueueResources | None = None,
    environ: Mapping[str, str] | None = None,
) -> Booted:
    """Build from ``QUEUE_DRIVER`` and the settings beside it; unset, nothing."""
    connections = Connections.from_env(environ)
    return build(connections, registry=registry, container=container, resources=resources, environ=environ)


def build_from_config(
    config: Any,
    *,
    registry: JobRegistry | None = None,
    container: Container | None = None,
    resources: QueueResources | None = None,
    environ: Mapping[str, str] | None = None,
) -> Booted:
    """Build from a ``queues`` section (dict, JSON/TOML path or :class:`Connections`).

    ``QUEUE_DRIVER`` set beside a section fails the boot; with no section it is
    built from instead."""
    connections = as_connections(config)
    env = os.environ if environ is None else environ
    queue_driver = env.get("QUEUE_DRIVER", "").strip()
    if len(connections) and queue_driver and not connections.from_environment:
        raise ConfigurationError(
            f"QUEUE_DRIVER={queue_driver} and a queues section are both set; each names the default connection, "
            "and a job dispatched to the one that lost would wait where nothing drains it. Remove one"
        )
    if not len(connections) and connections.default is None:
        connections = Connections.from_env(env)
    return build(connections, registry=registry, container=container, resources=resources, environ=environ)


def _one(what: str, given: Any, resource: Any) -> Any:
    if given is not None and resource is not None and given is not resource:
        raise ConfigurationError(
            f"two different {what} objects were given (the {what}= argument and QueueResources.{what}); give one"
        )
    return given if given is not None else resource


def build(
    connections: Connections,
    *,
    registry: JobRegistry | None,
    container: Container | None,
    resources: QueueResources | None,
    environ: Mapping[str, str] | None,
) -> Booted:
    """Build every declared connection; nothing is opened until every check passed."""
    connections.check_default()
    resources = resources or QueueResources()
    registry = _one("registry", registry, resources.registry)
    container = _one("container", container, resources.container)
    env = os.environ if environ is None else environ
    locks_url, locks_label = _locks_url(connections, resources, env)
    # Everything a connection needs is resolved before the first one is opened.
    context = BootContext(
        registry=registry, container=container, locks=resources.locks, database=resources.database, env=env
    )
    if locks_url is not None:
        context.locks = _lock_store(locks_url, locks_label)
    try:
        plans: list[tuple[ConnectionConfig, dict[str, Any]]] = []
        for config in connections:
            prepare = config.spec.prepare
            plans.append((config, prepare(config.where(), context) if prepare is not None else {}))
        outbox = _outbox(connections, context)
    except BaseException:
        if locks_url is not None and context.locks is not None:
            context.locks.close()
        raise
    booted = Booted({}, connections.default_name, registry, container, context.locks, outbox)
    booted.owns_locks = locks_url is not None
    try:
        for config, prepared in plans:
            booted.connections[config.name] = _build(config, prepared)
    except BaseException:
        booted.close()
        raise
    return booted


#: The variable (and ``app.config`` key, and Django setting) naming the manager's lock store by URL.
LOCKS_URL = "QUEUE_LOCKS_URL"

_LOCK_SCHEMES = {
    "redis": "redis", "rediss": "redis", "redis+sentinel": "redis", "redis+cluster": "redis", "unix": "redis",
    "postgresql": "database", "postgres": "database", "mysql": "database", "mariadb": "database",
    "sqlite": "database",
}  # fmt: skip


def _locks_url(connections: Connections, resources: QueueResources, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The lock store's URL, if one is configured, and how errors name it; at most one of
    ``QueueResources.locks``, the section's ``locks`` and ``QUEUE_LOCKS_URL`` may say where it is."""
    given: list[tuple[str, str | None]] = []
    if connections.locks is not None:
        given.append((connections.locks_label, connections.locks))
    written = env.get(LOCKS_URL, "").strip()
    if written:
        given.append((LOCKS_URL, written))
    if resources.locks is not None:
        given.append(("QueueResources.locks", None))
    if len(given) > 1:
        raise ConfigurationError(
            f"the lock store is given twice ({' and '.join(label for label, _ in given)}); give it once"
        )
    if not given or given[0][1] is None:
        return None, ""
    return given[0][1], given[0][0]


def _lock_store(url: str, label: str) -> LockStore:
    """The store ``url`` names: a ``RedisLockStore`` or a ``DatabaseLockStore``."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    kind = _LOCK_SCHEMES.get(scheme)
    if kind is None:
        raise ConfigurationError(
            f"{label}={url!r} is not a lock store URL: it takes redis://..., rediss://..., unix://..., "
            "redis+sentinel://..., redis+cluster://..., postgresql://..., postgres://..., mysql://..., "
            "mariadb://... or sqlite:///..."
        )
    try:
        if kind == "redis":
            from ..drivers.redis.store import RedisLockStore

            return RedisLockStore.from_url(url)
        from ..drivers.database.store import DatabaseLockStore

        return DatabaseLockStore.from_url(url)
    except DriverUnavailableError as exc:
        extra = "redis" if kind == "redis" else "the database's"
        raise ConfigurationError(f"{label}: {exc} (needed for {extra} lock store)") from exc
    except ImportError as exc:
        raise ConfigurationError(f"{label}: the {kind} lock store needs {exc.name or 'a missing package'}") from exc
    except QueueUnavailableError as exc:
        raise type(exc)(f"{label}: {exc}") from exc
    except (ValueError, TypeError, ConfigurationError) as exc:
        raise ConfigurationError(f"{label}={url!r}: {exc}") from exc


def _outbox(connections: Connections, context: BootContext) -> Outbox | None:
    """The outbox of the connections declared with ``outbox = true``, in the
    application's database (nothing is opened: a dispatch writes through the
    caller's connection)."""
    names = [config.name for config in connections if config.settings.get("outbox")]
    if not names:
        return None
    first = connections[names[0]]
    where = f"{first.where(first.label('outbox'))}: {first.label('outbox')} = true"
    url, label = context.database, "QueueResources.database"
    if url is None:
        url, label = context.env.get("DATABASE_URL", "").strip(), "DATABASE_URL"
        if not url:
            raise ConfigurationError(
                f"{where} puts its jobs in an outbox table of the application's database, and DATABASE_URL is not "
                "set (nor QueueResources.database); set it to the URL of the database whose connections you pass "
                "to within()"
            )
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"{where} needs {label} to be a database URL such as sqlite:///app.db, got {url!r}")
    from ..drivers.database.outbox import Outbox

    try:
        return Outbox(url, connections=names)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from exc


def _build(config: ConnectionConfig, prepared: dict[str, Any]) -> BaseQueue:
    """Build one connection's driver; what goes wrong is named after the connection."""
    spec = config.spec
    where = config.where()
    extra = f"; install it with: pip install 'rainier_sync[{spec.extra}]'" if spec.extra else ""
    settings = {key: value for key, value in config.settings.items() if key != "outbox"}
    try:
        return spec.build(settings, prepared)
    except DriverUnavailableError as exc:
        raise ConfigurationError(f"{where}: {exc}{'' if 'pip install' in str(exc) else extra}") from exc
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing.startswith("rainier_sync"):
            raise ConfigurationError(f"{where}: the {spec.name} driver is not part of this installation") from exc
        needs = missing or "a missing package"
        raise ConfigurationError(f"{where}: the {spec.name} driver needs {needs}{extra}") from exc
    except QueueUnavailableError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    except (ValueError, TypeError) as exc:
        # The driver's own check, named after the connection it refused.
        raise ConfigurationError(f"{where}: {exc}") from exc
