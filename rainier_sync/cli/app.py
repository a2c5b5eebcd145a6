"""Where a command's manager comes from: ``--app``, ``RAINIER_APP`` or the
environment, and the :class:`Frontend` (``rainier-sync`` or ``flask queue``)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..drivers.base import BaseQueue
    from ..manager import QueueManager
    from ..worker import Worker, WorkerOptions

__all__ = ["Frontend", "UsageError", "CommandError", "load_app", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE",
           "EXIT_INTERRUPTED"]  # fmt: skip

#: The command did what it was asked.
EXIT_OK = 0
#: An operation failed (a backend error or one that cannot be reached, a failed job id nobody has,
#: a file in the way, a job that failed for good under ``queue:work --fail-on-failed``).
EXIT_FAILURE = 1
#: Bad usage or configuration: a wrong option, an ``--app`` that does not load, a refused setting.
EXIT_USAGE = 2
#: Interrupted by Ctrl-C (outside ``queue:work``, which stops gracefully and exits 0).
EXIT_INTERRUPTED = 130

class UsageError(Exception):
    """Bad usage or configuration (exit 2)."""


class CommandError(Exception):
    """The command could not do what it was asked (exit 1)."""


class Frontend:
    """How the commands are reached: as ``rainier-sync`` (this class), or as
    ``flask queue`` on a Flask app's manager. Commands, options, output and
    exit codes are the same; the names in messages, where the manager comes
    from and the worker class differ."""

    #: The program as the user types it; every error line starts with ``<name>: error:``.
    name = "rainier-sync"
    #: Whether ``--app`` names the application (``flask`` has an ``--app`` of its own).
    takes_app = True
    #: What ``queue:work`` says to do about an empty job registry.
    registry_hint = "pass --app module:attribute (or set RAINIER_APP) naming the application that registers its jobs"

    def command(self, command: str) -> str:
        """How the user types ``command`` (``queue:failed``), program included."""
        return f"{self.name} {command}"

    #: The Flask app ``--app`` named (its manager is the one the commands work on), or None.
    flask_app: Any = None

    def manager(self, args: argparse.Namespace) -> QueueManager:
        """The manager the command works on."""
        manager, self.flask_app = booted_manager(args)
        return manager

    def worker(self, manager: QueueManager, options: WorkerOptions, connection: str | None) -> Worker:
        """The worker ``queue:work`` runs: on a Flask app's manager a ``FlaskWorker``,
        which runs every job inside an app context."""
        if self.flask_app is not None:
            from ..flask import FlaskWorker

            return FlaskWorker(self.flask_app, manager, options=options, connection=connection)
        from ..worker import Worker

        return Worker(manager, options=options, connection=connection)




def load_app(reference: str, origin: str = "--app") -> QueueManager:
    """The QueueManager ``module:attribute`` names: the manager itself, or what
    a zero-argument factory there returns; for a Flask app (or a factory returning
    one), the manager of its ``RainierSync`` extension."""
    return load_target(reference, origin)[0]


def _flask_manager(app: Any, reference: str, origin: str) -> QueueManager | None:
    """The manager of ``app``'s ``RainierSync``, when ``app`` is a Flask app; else None."""
    flask = sys.modules.get("flask")  # a Flask app exists only once flask is imported
    if flask is None or not isinstance(app, flask.Flask):
        return None
    from ..flask import EXTENSION_KEY, get_state

    if EXTENSION_KEY not in app.extensions:
        raise UsageError(
            f"{origin} {reference} is the Flask app {app.name!r}, which has no rainier_sync extension: "
            "call RainierSync(app) (or init_app(app)) where the app is built"
        )
    return get_state(app).manager


def load_target(reference: str, origin: str = "--app") -> tuple[QueueManager, Any]:
    """:func:`load_app`'s manager, and the Flask app it belongs to (None when not a Flask app's)."""
    from ..errors import ConfigurationError
    from ..manager import QueueManager

    module_name, colon, attribute = reference.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"{origin} {reference!r} must be module:attribute, e.g. myapp.queues:manager")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # the console script does not put the working directory on the path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(f"{origin} {reference}: no module named {exc.name!r} (is it on PYTHONPATH?)") from exc
        raise UsageError(f"{origin} {reference}: importing {module_name!r} failed: {one_line(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - whatever the module raised, say so in one line
        raise UsageError(f"{origin} {reference}: importing {module_name!r} failed: {one_line(exc)}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{origin} {reference}: module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(target, QueueManager):
        return target, None
    manager = _flask_manager(target, reference, origin)
    if manager is not None:
        return manager, target
    if isinstance(target, type) or not callable(target):
        raise UsageError(
            f"{origin} {reference} is {article(target)}, not a QueueManager or a zero-argument factory returning one "
            "(nor a Flask app)"
        )
    try:
        result = target()
    except ConfigurationError:
        raise
    except TypeError as exc:
        raise UsageError(f"{origin} {reference}: calling the factory with no arguments failed: {exc}") from exc
    if isinstance(result, QueueManager):
        return result, None
    manager = _flask_manager(result, reference, origin)
    if manager is None:
        raise UsageError(
            f"{origin} {reference} returned an object of type {type(result).__qualname__}, not a QueueManager "
            "(nor a Flask app)"
        )
    return manager, result


def article(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    return f"of type {type(value).__qualname__}"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def booted_manager(args: argparse.Namespace) -> tuple[QueueManager, Any]:
    """The command's manager, and the Flask app ``--app`` named it through (or None)."""
    from ..manager import QueueManager, set_instance

    reference = getattr(args, "app", None)
    origin = "--app"
    if not reference:
        reference, origin = os.environ.get("RAINIER_APP", "").strip(), "RAINIER_APP"
    app = None
    if reference:
        manager, app = load_target(reference, origin)
        set_instance(manager)
    else:
        manager = QueueManager.from_env()
        args.booted = manager  # built here, so closed here; an application's manager is its own to close
    if not manager.connections:
        raise UsageError("no queue is configured: pass --app module:attribute, set RAINIER_APP, or set QUEUE_DRIVER")
    return manager, app


def selected(manager: QueueManager, name: str | None) -> list[tuple[str, BaseQueue]]:
    if name is not None:
        return [(name, manager.connection(name))]
    return list(manager.connections.items())


