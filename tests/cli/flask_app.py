"""tests.cli.app's manager in a Flask app, for ``flask --app tests.cli.flask_app queue ...``
(the same jobs, set up by the same ``CLI_APP_*`` variables)."""

from __future__ import annotations

from flask import Flask

from rainier_sync.flask import RainierSync

from . import app


def create_app() -> Flask:
    flask_app = Flask("cli_flask_app")
    RainierSync(flask_app, manager=app.make_manager())
    return flask_app
