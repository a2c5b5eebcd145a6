"""``flask queue ...``: the ``rainier-sync queue:*`` commands, run against the
current app's manager, with every job of ``flask queue work`` inside an app
context."""

from __future__ import annotations

import datetime
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click
from flask import current_app
from flask.cli import with_appcontext

from ..errors import RainierError
from ..worker import WorkerOptions

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..manager import QueueManager

__all__ = ["queue_group"]

F = TypeVar("F", bound=Callable[..., Any])


def _manager() -> QueueManager:
    from . import get_state

    return get_state().manager


def _connections(manager: QueueManager, name: str | None) -> list[tuple[str, BaseQueue]]:
    if name is not None:
        return [(name, manager.connection(name))]
    return sorted(manager.connections.items())


def _clear_errors(fn: F) -> F:
    """A library error ends the command with one line and exit code 1."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except (RainierError, ValueError, TypeError, LookupError) as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a backend that does not answer: one line, not a traceback
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper  # type: ignore[return-value]


@click.group("queue", help="Run and manage this app's rainier_sync job queues.")
def queue_group() -> None:
    pass


@queue_group.command("work")
@click.option("--queue", "queues", default="default", show_default=True, help="Queues to work, in order: a,b.")
@click.option("--once", is_flag=True, help="Run what is due, then exit.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Exit after taking this many jobs.")
@click.option("--sleep", type=click.FloatRange(min=0), default=1.0, show_default=True, help="Longest idle wait (s).")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Handler threads.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Default attempt limit (s).")
@click.option("--connection", default=None, help="Connection to work (default: the default one).")
@with_appcontext
@_clear_errors
def work(
    queues: str,
    once: bool,
    max_jobs: int | None,
    sleep: float,
    concurrency: int,
    timeout: float | None,
    connection: str | None,
) -> None:
    """Work jobs, each inside a fresh app context."""
    from . import FlaskWorker

    app = current_app._get_current_object()  # type: ignore[attr-defined]
    options = WorkerOptions(
        queues=[q.strip() for q in queues.split(",") if q.strip()],
        once=once,
        max_jobs=max_jobs,
        sleep=sleep,
        concurrency=concurrency,
        timeout=timeout,
        connection=connection,
    )
    worker = FlaskWorker(app, options=options, connection=connection)
    if threading.current_thread() is threading.main_thread():
        worker.install_signal_handlers()
    logging.getLogger("rainier_sync").info("working %s on %s", ",".join(options.queues), worker.connection_name)
    stats = worker.run()
    click.echo(
        f"processed {stats.processed}, released {stats.released}, failed {stats.failed}",
        err=True,
    )


@queue_group.command("failed")
@click.option("--connection", default=None, help="Only this connection.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@with_appcontext
@_clear_errors
def failed(connection: str | None, limit: int) -> None:
    """List failed jobs, newest first."""
    rows = 0
    for name, driver in _connections(_manager(), connection):
        for job in driver.failed_jobs(limit):
            when = datetime.datetime.fromtimestamp(job.failed_at, tz=datetime.timezone.utc)
            click.echo(f"{job.id}  {name}/{job.queue}  {job.name}  {when:%Y-%m-%d %H:%M:%S}Z  {job.error}")
            rows += 1
    if not rows:
        click.echo("no failed jobs", err=True)


def _each_failed(manager: QueueManager, connection: str | None, action: str, job_id: str) -> int:
    done = 0
    for _, driver in _connections(manager, connection):
        op = driver.retry_failed if action == "retry" else driver.forget_failed
        if job_id == "all" and action == "retry":
            for job in driver.failed_jobs(limit=1_000_000):
                done += bool(op(job.id))
        elif op(job_id):
            done += 1
    return done


@queue_group.command("retry")
@click.argument("job_id", metavar="ID|all")
@click.option("--connection", default=None, help="Only this connection.")
@with_appcontext
@_clear_errors
def retry(job_id: str, connection: str | None) -> None:
    """Queue a failed job (or all of them) again."""
    done = _each_failed(_manager(), connection, "retry", job_id)
    if job_id != "all" and not done:
        raise click.ClickException(f"no failed job with id {job_id!r}")
    click.echo(f"queued again: {done}")


@queue_group.command("forget")
@click.argument("job_id", metavar="ID")
@click.option("--connection", default=None, help="Only this connection.")
@with_appcontext
@_clear_errors
def forget(job_id: str, connection: str | None) -> None:
    """Delete a failed job."""
    if not _each_failed(_manager(), connection, "forget", job_id):
        raise click.ClickException(f"no failed job with id {job_id!r}")
    click.echo(f"forgot {job_id}")


@queue_group.command("reclaim")
@click.option("--connection", default=None, help="Only this connection.")
@with_appcontext
@_clear_errors
def reclaim(connection: str | None) -> None:
    """Make jobs whose reservation lapsed available again."""
    for name, driver in _connections(_manager(), connection):
        click.echo(f"{name}: reclaimed {driver.reclaim_expired()}")


@queue_group.command("status")
@click.option("--connection", default=None, help="Only this connection.")
@with_appcontext
@_clear_errors
def status(connection: str | None) -> None:
    """Jobs per queue: ready, delayed, reserved; and failed per connection."""
    from .dashboard import queue_names

    manager = _manager()
    for name, driver in _connections(manager, connection):
        click.echo(f"{name} ({driver.driver.value}): failed {driver.failed_count()}")
        for queue in queue_names(manager, driver):
            c = driver.counts(queue)
            click.echo(f"  {queue}: ready {c.ready}, delayed {c.delayed}, reserved {c.reserved}")


@queue_group.command("migrate")
@click.option("--connection", default=None, help="Only this connection.")
@with_appcontext
@_clear_errors
def migrate(connection: str | None) -> None:
    """Create the tables the database driver needs."""
    migrated = 0
    for name, driver in _connections(_manager(), connection):
        run = getattr(driver, "migrate", None)
        if callable(run):
            run()
            migrated += 1
            click.echo(f"{name}: migrated")
    if not migrated:
        click.echo("nothing to migrate: no connection uses the database driver", err=True)
