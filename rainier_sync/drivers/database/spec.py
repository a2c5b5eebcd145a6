"""What configuration knows of the database driver."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from ..promises import Promises
from ..spec import QUEUE_DECOY, BootContext, DriverSpec, Setting, duration, flag, seconds

__all__ = ["SPEC", "PROMISES"]

_FROM_DATABASE_URL = "QueueResources(database=url), or DATABASE_URL in the environment"


def _prepare(where: str, context: BootContext) -> dict[str, Any]:
    url, label = context.database, "QueueResources.database"
    if url is None:
        url, label = context.env.get("DATABASE_URL", "").strip(), "DATABASE_URL"
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


def _build(settings: dict[str, Any], prepared: dict[str, Any]) -> Any:
    from ._queue import DatabaseQueue

    return DatabaseQueue.from_url(prepared["url"], **settings)


#: What the database driver promises about the jobs it accepts.
PROMISES = Promises()

SPEC = DriverSpec(
    promises=PROMISES,
    name="database",
    rank=2,
    build=_build,
    prepare=_prepare,
    extra="postgres",
    settings={
        "reservation": Setting(seconds(), env=("QUEUE_RESERVATION",)),
        "reconnect_for": Setting(duration(0.0)),
        "response_timeout": Setting(duration(0.001)),
        # False behind a transaction-pooling pgbouncer: poll instead of LISTEN.
        "listen": Setting(flag()),
    },
    period="reservation",
    default_period=90,
    refusals={
        "url": ("the database driver uses the application's database, not a URL of its own", _FROM_DATABASE_URL),
        "connection": (
            "the database driver uses the application's database, not a named connection",
            _FROM_DATABASE_URL,
        ),
        "outbox": (
            "the database driver writes a job within the caller's transaction itself, in its own table",
            "nothing: manager.pending(job).within(conn) already commits with the caller",
        ),
    },
    env_refused={
        "DB_QUEUE": QUEUE_DECOY,
        "DB_QUEUE_TABLE": ("the queue's tables are fixed by its migrations", "nothing: run queue:migrate"),
        "DB_QUEUE_RETRY_AFTER": ("it is the reservation under another name", "QUEUE_RESERVATION"),
        "DB_QUEUE_CONNECTION": ("the database comes from DATABASE_URL", "DATABASE_URL"),
    },
)
