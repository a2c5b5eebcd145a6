"""Flask integration: ``RainierSync(app)``.

- boots the queue from ``app.config`` (``QUEUE_DRIVER`` and the settings beside
  it, or a ``RAINIER_QUEUES`` section), or takes an explicit ``manager=``;
- makes :func:`rainier_sync.instance` answer the current app's manager inside
  an app context;
- runs every job inside a fresh ``app.app_context()`` (:class:`FlaskWorker`);
- adds ``flask queue work|failed|retry|forget|reclaim|status|migrate|check|schedule-run|...``;
- mounts the dashboard (:mod:`rainier_sync.flask.dashboard`), which refuses
  every request until the app gives it an authorisation callback, and will not
  serve without a secret key of the app's own (:data:`SHIPPED_SECRET_KEYS`).

State lives in ``app.extensions["rainier_sync"]``; the extension object keeps
no reference to an app, so one object can serve several apps (the
application-factory pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..config import QueueResources, build_from_env
from ..config.boot import LOCKS_URL
from ..container import Container
from ..errors import ConfigurationError, DriverUnavailableError
from ..jobs import Job
from ..manager import OWN_STORE, QueueManager, add_instance_resolver
from ..registry import JobRegistry
from ..worker import Worker, WorkerOptions, WorkerStats

try:
    from flask import Flask, current_app, has_app_context
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise DriverUnavailableError(
        "rainier_sync.flask needs Flask: pip install 'rainier_sync[flask]'"
    ) from exc

__all__ = ["RainierSync", "FlaskWorker", "get_state", "EXTENSION_KEY", "SHIPPED_SECRET_KEYS"]

#: The key of this extension's state in ``app.extensions``.
EXTENSION_KEY = "rainier_sync"

#: ``app.config`` keys this extension reads itself (the rest of ``app.config``
#: is offered to ``QueueManager.from_env`` as its environment).
CONFIG_SECTION = "RAINIER_QUEUES"
CONFIG_DRIVER = "QUEUE_DRIVER"
#: The lock store's URL (:data:`rainier_sync.config.boot.LOCKS_URL`), read by the boot with the rest.
CONFIG_LOCKS = LOCKS_URL

Authorize = Callable[[], bool]

#: Every secret key rainier_sync has published, in its examples, docs, tests
#: and benchmarks, now or in an earlier release. Anyone can sign a Flask
#: session with one of them, so an app using one as ``SECRET_KEY`` (or in
#: ``SECRET_KEY_FALLBACKS``) would let a forged session cookie through the
#: dashboard's login and CSRF check: the dashboard refuses to run with them.
#: A test scans the repository so that a key written anywhere in it is here.
SHIPPED_SECRET_KEYS: frozenset[str] = frozenset(
    {
        "development only: set SECRET_KEY",  # examples/flask_app, when SECRET_KEY was not set
        "test-secret",  # the Flask tests' apps
        "bench",  # tests/benchmarks/bench_flask.py
        "...",  # the docs' sample configuration
    }
)
_SHIPPED_KEY_BYTES = frozenset(key.encode("utf-8") for key in SHIPPED_SECRET_KEYS)


def _key_bytes(key: object) -> bytes:
    if isinstance(key, bytes):
        return key
    return str(key).encode("utf-8") if key is not None else b""


def _secret_key_problem(app: Flask) -> str | None:
    """Why ``app``'s secret key cannot protect the dashboard's session and
    CSRF token (it is not set, or it is one of :data:`SHIPPED_SECRET_KEYS`),
    or ``None`` when it can."""
    key = _key_bytes(app.secret_key)
    if not key.strip():
        return "app.config['SECRET_KEY'] is not set"
    if key in _SHIPPED_KEY_BYTES:
        return (
            "app.config['SECRET_KEY'] is a value published with rainier_sync (in its examples, docs or tests): "
            "anyone can sign a session cookie with it"
        )
    fallbacks = app.config.get("SECRET_KEY_FALLBACKS") or ()
    for fallback in fallbacks if isinstance(fallbacks, (list, tuple)) else (fallbacks,):
        raw = _key_bytes(fallback)
        if not raw.strip() or raw in _SHIPPED_KEY_BYTES:
            return (
                "app.config['SECRET_KEY_FALLBACKS'] holds an empty key or a value published with rainier_sync "
                "(in its examples, docs or tests): anyone can sign a session cookie with it"
            )
    return None


#: How to mend what :func:`_secret_key_problem` reports.
_SECRET_KEY_ADVICE = (
    "Set SECRET_KEY to a long random secret kept out of the code, for instance the output of "
    "python -c 'import secrets; print(secrets.token_hex())'"
)


# -- state ---------------------------------------------------------------------------------
@dataclass
class RainierState:
    """What ``app.extensions["rainier_sync"]`` holds for one app."""

    manager: QueueManager
    authorize: Authorize | None
    workers: list[Worker] = field(default_factory=list)


def get_state(app: Flask | None = None) -> RainierState:
    """This extension's state for ``app`` (default: the current app)."""
    target = app if app is not None else current_app
    try:
        state: RainierState = target.extensions[EXTENSION_KEY]
    except KeyError:
        raise RuntimeError(
            f"rainier_sync is not set up on the Flask app {target.name!r}: call RainierSync(app) or init_app(app)"
        ) from None
    return state


def _current_manager() -> QueueManager | None:
    if not has_app_context():
        return None
    state = current_app.extensions.get(EXTENSION_KEY)
    return state.manager if isinstance(state, RainierState) else None


add_instance_resolver(_current_manager)


# -- running jobs inside an app context ---------------------------------------------------
class FlaskWorker(Worker):
    """A :class:`~rainier_sync.Worker` whose jobs each run inside a fresh
    ``app.app_context()``: ``current_app``, ``flask.g`` (new for every job) and
    the app's extensions work in a job as in a request.

    An attempt with a time limit runs in a supervised child process forked
    from this worker's loop, which runs inside an app context of its own: such
    a job sees ``current_app``, but ``flask.g`` lives as long as the child.
    """

    def __init__(
        self,
        app: Flask,
        manager: QueueManager | None = None,
        options: WorkerOptions | None = None,
        *,
        connection: str | None = None,
    ) -> None:
        manager = manager if manager is not None else get_state(app).manager
        super().__init__(manager, options=options, connection=connection)
        self.app = app
        self.executor.attempt_context = lambda queued: app.app_context()

    def run(self) -> WorkerStats:
        """Work (see :meth:`Worker.run`); the owning loop runs in an app context,
        which the child processes of timed attempts inherit."""
        with self.app.app_context():
            return super().run()


# -- the extension ---------------------------------------------------------------------------
_UNSET: Any = object()


class RainierSync:
    """The Flask extension.

    ``RainierSync(app, manager=...)`` or, with an application factory,
    ``queues = RainierSync(); queues.init_app(app)``. Arguments given here are
    defaults for every :meth:`init_app`; :meth:`init_app` may override them.

    - ``manager``: an explicit :class:`~rainier_sync.QueueManager`. Without
      it the queue is booted from ``app.config`` (see :meth:`boot`).
    - ``registry``, ``container``, ``resources``: handed to the boot.
    - ``authorize``: a callable run for every dashboard request (inside the
      request); the dashboard answers 403 unless it returns true. Without one
      the dashboard refuses every request.
    - ``dashboard_url``: where the dashboard is mounted (``None``: not mounted).
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        manager: QueueManager | None = None,
        registry: JobRegistry | None = None,
        container: Container | None = None,
        resources: QueueResources | None = None,
        authorize: Authorize | None = None,
        dashboard_url: str | None = "/queues",
    ) -> None:
        self._defaults: dict[str, Any] = {
            "manager": manager,
            "registry": registry,
            "container": container,
            "resources": resources,
            "authorize": authorize,
            "dashboard_url": dashboard_url,
        }
        if app is not None:
            self.init_app(app)

    def init_app(
        self,
        app: Flask,
        *,
        manager: QueueManager | None = _UNSET,
        registry: JobRegistry | None = _UNSET,
        container: Container | None = _UNSET,
        resources: QueueResources | None = _UNSET,
        authorize: Authorize | None = _UNSET,
        dashboard_url: str | None = _UNSET,
    ) -> None:
        """Set the extension up on ``app``: boot (or take) the manager, add the
        ``flask queue`` commands and mount the dashboard."""
        given = {
            "manager": manager,
            "registry": registry,
            "container": container,
            "resources": resources,
            "authorize": authorize,
            "dashboard_url": dashboard_url,
        }
        opts: dict[str, Any] = {key: self._defaults[key] if value is _UNSET else value for key, value in given.items()}
        if EXTENSION_KEY in app.extensions:
            raise RuntimeError(f"rainier_sync is already set up on the Flask app {app.name!r}")
        url = opts["dashboard_url"]
        if url is not None and (not isinstance(url, str) or not url.startswith("/")):
            raise ValueError(f"dashboard_url must be a path starting with '/', or None; got {url!r}")
        if opts["authorize"] is not None and not callable(opts["authorize"]):
            raise TypeError(f"authorize must be a callable returning a bool, got {opts['authorize']!r}")
        if url is not None and opts["authorize"] is not None:
            # The dashboard would serve: its login (the app's session) and CSRF token are only as
            # safe as the key that signs them.
            problem = _secret_key_problem(app)
            if problem is not None:
                raise ConfigurationError(
                    f"the rainier_sync dashboard will not run: {problem}. {_SECRET_KEY_ADVICE}, before "
                    "RainierSync.init_app(app); or mount no dashboard (dashboard_url=None)."
                )
        if opts["manager"] is not None:
            if not isinstance(opts["manager"], QueueManager):
                raise TypeError(f"manager must be a rainier_sync.QueueManager, got {type(opts['manager']).__name__}")
            extra = [key for key in ("registry", "container", "resources") if opts[key] is not None]
            if extra:
                raise TypeError(
                    f"{', '.join(extra)} would be ignored: they are for booting from app.config, and the manager= "
                    "given brings its own"
                )
            configured = [
                key for key in (CONFIG_DRIVER, CONFIG_SECTION, CONFIG_LOCKS) if app.config.get(key) is not None
            ]
            if configured:
                raise ConfigurationError(
                    f"RainierSync was given manager= and app.config also sets {' and '.join(configured)}; "
                    "keep one of the two"
                )
            mgr: QueueManager = opts["manager"]
        else:
            mgr = self.boot(
                app.config, registry=opts["registry"], container=opts["container"], resources=opts["resources"]
            )
        _bind_flask(mgr.container)
        app.extensions[EXTENSION_KEY] = RainierState(manager=mgr, authorize=opts["authorize"])
        from .commands import queue_group

        if "queue" not in app.cli.commands:
            app.cli.add_command(queue_group)
        if url is not None:
            from .dashboard import blueprint

            app.register_blueprint(blueprint, url_prefix=url.rstrip("/") or None)

    @staticmethod
    def boot(
        config: Mapping[str, Any],
        *,
        registry: JobRegistry | None = None,
        container: Container | None = None,
        resources: QueueResources | None = None,
    ) -> QueueManager:
        """A manager booted from a Flask config: ``QUEUE_DRIVER`` (with its
        settings, e.g. ``DATABASE_URL``, read from the same config) or a
        ``RAINIER_QUEUES`` section (a dict, or a JSON/TOML file path). Both set
        is an error; neither gives a manager with no queue. ``QUEUE_LOCKS_URL``
        (or the section's ``locks``) names the lock store by URL."""
        section = config.get(CONFIG_SECTION)
        driver = config.get(CONFIG_DRIVER)
        if section is not None and driver is not None:
            raise ConfigurationError(
                f"app.config sets both {CONFIG_DRIVER} and {CONFIG_SECTION}; keep one of the two"
            )
        environ = _config_environ(config)
        if section is not None:
            return QueueManager.from_config(
                section, registry=registry, container=container, resources=resources, environ=environ
            )
        if driver is not None:
            return QueueManager.from_env(registry=registry, container=container, resources=resources, environ=environ)
        # No queue is declared: what is built is only the lock store QUEUE_LOCKS_URL may name.
        booted = build_from_env(registry=registry, container=container, resources=resources, environ=environ)
        return QueueManager(
            registry=booted.registry,
            container=booted.container,
            locks=booted.locks if booted.locks is not None else OWN_STORE,
        )

    # -- the current app's queue -------------------------------------------------------
    @property
    def manager(self) -> QueueManager:
        """The current app's manager (needs an app context)."""
        return get_state().manager

    def dispatch(self, job: Job) -> str | None:
        """``manager.dispatch(job)`` on the current app's manager."""
        return self.manager.dispatch(job)

    def worker(
        self,
        app: Flask | None = None,
        options: WorkerOptions | None = None,
        *,
        connection: str | None = None,
        **option_values: Any,
    ) -> FlaskWorker:
        """A :class:`FlaskWorker` for ``app`` (default: the current app).
        ``option_values`` build the :class:`~rainier_sync.WorkerOptions` when
        ``options`` is not given."""
        target: Flask = app if app is not None else current_app._get_current_object()  # type: ignore[attr-defined]
        if options is None:
            options = WorkerOptions(**option_values)
        elif option_values:
            raise TypeError("pass options= or worker option keywords, not both")
        return FlaskWorker(target, options=options, connection=connection)

    def start_worker(
        self,
        app: Flask | None = None,
        options: WorkerOptions | None = None,
        *,
        connection: str | None = None,
        **option_values: Any,
    ) -> FlaskWorker:
        """Start a worker in a background thread of this process (for
        development). Stop it with ``worker.stop(); worker.join()``."""
        worker = self.worker(app, options, connection=connection, **option_values)
        target: Flask = worker.app
        get_state(target).workers.append(worker)
        worker.start()
        return worker


def _config_environ(config: Mapping[str, Any]) -> dict[str, str]:
    """The app config as the string environment ``QueueManager.from_env`` reads."""
    environ: dict[str, str] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not key.isupper() or key == CONFIG_SECTION:
            continue
        if isinstance(value, bool):
            environ[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            environ[key] = str(value)
    return environ


def _bind_flask(container: Container) -> None:
    """Let jobs resolve the Flask app running them from the container."""
    if not container.bound(Flask):
        container.scoped(Flask, lambda: current_app._get_current_object())  # type: ignore[attr-defined]

