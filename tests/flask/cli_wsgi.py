"""A Flask app as ``rainier-sync --app`` is pointed at one: ``app`` (the object,
as a WSGI server imports it) and ``create_app`` (the application factory)."""

from __future__ import annotations

from flask import Flask

from rainier_sync import Container
from rainier_sync.flask import RainierSync

from .apps import registry

queues = RainierSync(dashboard_url=None)


def create_app() -> Flask:
    app = Flask("cli_wsgi")
    app.config.update(QUEUE_DRIVER="memory", GREETING="hello from the app")
    queues.init_app(app, registry=registry(), container=Container())
    return app


def bare_app() -> Flask:
    """A Flask app without the extension."""
    return Flask("no_queues")


app = create_app()
