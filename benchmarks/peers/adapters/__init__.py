"""The peers: name -> (module, adapter class). Modules are imported only when their peer is asked for."""

from __future__ import annotations

import importlib

from adapters.base import Adapter

PEERS: dict[str, tuple[str, str]] = {
    "rainier-redis": ("adapters.peer_rainier", "RainierRedisAdapter"),
    "rainier-postgres": ("adapters.peer_rainier", "RainierPostgresAdapter"),
    "rainier-sqlite": ("adapters.peer_rainier", "RainierSqliteAdapter"),
    "rq": ("adapters.peer_rq", "RqAdapter"),
    "dramatiq": ("adapters.peer_dramatiq", "DramatiqAdapter"),
    "huey-redis": ("adapters.peer_huey", "HueyRedisAdapter"),
    "huey-sqlite": ("adapters.peer_huey", "HueySqliteAdapter"),
    "celery": ("adapters.peer_celery", "CeleryAdapter"),
    "procrastinate": ("adapters.peer_procrastinate", "ProcrastinateAdapter"),
}


def load(name: str) -> type[Adapter]:
    """The adapter class of peer ``name``; ImportError when its library is not installed."""
    module, cls = PEERS[name]
    adapter: type[Adapter] = getattr(importlib.import_module(module), cls)
    return adapter
