"""A small Flask app that queues a welcome email when someone signs up.

Development (the worker runs in a thread of the web process)::

    EMBEDDED_WORKER=1 flask --app examples.flask_app run --debug

Production (the web process only dispatches; workers run on their own)::

    export SECRET_KEY=$(python -c 'import secrets; print(secrets.token_hex())')
    flask --app examples.flask_app queue migrate
    gunicorn 'examples.flask_app:create_app()'
    flask --app examples.flask_app queue work --queue mail,default

The app keeps its signups through Flask-SQLAlchemy, and the queue lives in the
same SQLite file, so the signup and its welcome job are written in the same
transaction (``within(db.session)``): either both are stored or neither is.
The dashboard is at ``/queues`` for a visitor who logged in at ``/login``
with ``DASHBOARD_PASSWORD``.

The session that holds that login is signed with ``SECRET_KEY``, read from
the environment: the app refuses to start without it, except in debug and
testing runs, which make up a throwaway key (logins last as long as the
process).

It needs Flask-SQLAlchemy: ``pip install 'rainier_sync[flask,sqlalchemy]' Flask-SQLAlchemy``.
"""

from __future__ import annotations

import hmac
import os
import pathlib
import secrets
from typing import Any, Mapping

from flask import Flask, abort, redirect, render_template, request, session, url_for
from werkzeug.serving import is_running_from_reloader
from werkzeug.wrappers import Response

from rainier_sync import Container, JobRegistry
from rainier_sync.flask import RainierSync

from .jobs import Mailer, SendWelcome
from .models import Signup, db

queues = RainierSync(dashboard_url="/queues")


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(
        SECRET_KEY=os.environ.get("SECRET_KEY") or None,
        APP_DATABASE=os.environ.get("APP_DATABASE", str(pathlib.Path(app.instance_path) / "app.db")),
        DASHBOARD_PASSWORD=os.environ.get("DASHBOARD_PASSWORD", ""),
        EMBEDDED_WORKER=os.environ.get("EMBEDDED_WORKER", "") == "1",
    )
    if config:
        app.config.update(config)
    if not app.config["SECRET_KEY"]:
        # Whoever knows the key can sign a session that is logged in to the dashboard:
        # a key written here would be known to everyone who has read this file.
        if not (app.debug or app.testing):
            raise RuntimeError(
                "SECRET_KEY is not set: put a long random secret in the SECRET_KEY environment variable "
                "(python -c 'import secrets; print(secrets.token_hex())' makes one); only debug and testing "
                "runs go without, on a throwaway key"
            )
        app.config["SECRET_KEY"] = secrets.token_hex(32)
    database = pathlib.Path(app.config["APP_DATABASE"]).resolve()
    database.parent.mkdir(parents=True, exist_ok=True)
    app.config.setdefault("SQLALCHEMY_DATABASE_URI", f"sqlite:///{database}")

    # The queue is booted from app.config: QUEUE_DRIVER and the settings beside it.
    # DATABASE_URL may be the very URL the app's session uses (sqlite://, postgresql+psycopg://, ...).
    app.config.setdefault("QUEUE_DRIVER", "database")
    app.config.setdefault("DATABASE_URL", app.config["SQLALCHEMY_DATABASE_URI"])
    db.init_app(app)
    with app.app_context():
        db.create_all()
    queues.init_app(
        app,
        registry=JobRegistry().with_job(SendWelcome),
        container=Container().singleton(Mailer, lambda: Mailer()),
        authorize=lambda: session.get("dashboard") is True,
    )
    with app.app_context():
        queues.manager.connection().migrate()  # idempotent; production runs `flask queue migrate` too
    app.register_blueprint(_pages(), url_prefix="")

    # Flask's reloader runs the app in a child process and only watches files in
    # the parent: start the worker where requests are served.
    if app.config["EMBEDDED_WORKER"] and (not app.debug or is_running_from_reloader()):
        queues.start_worker(app, queues=["mail", "default"], concurrency=2)
    return app


def _pages() -> Any:
    from flask import Blueprint

    pages = Blueprint("signups", __name__)

    @pages.get("/")
    def home() -> str:
        recent = db.session.scalars(db.select(Signup).order_by(Signup.id.desc()).limit(20))
        return render_template("signup.html", signups=recent)

    @pages.post("/signup")
    def signup() -> Response:
        name = request.form.get("name", "").strip()
        email = request.form.get("email", "").strip()
        if not name or "@" not in email:
            abort(400, description="a name and an email address are needed")
        # One transaction: the signup and its welcome job commit together, or neither is stored.
        signup = Signup(name=name, email=email)
        db.session.add(signup)
        db.session.flush()  # gives the signup its id
        queues.manager.pending(SendWelcome(signup_id=signup.id)).within(db.session).send()
        db.session.commit()
        return redirect(url_for("signups.home"), code=303)

    @pages.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        from flask import current_app

        if request.method == "POST":
            expected = current_app.config["DASHBOARD_PASSWORD"]
            given = request.form.get("password", "")
            if expected and hmac.compare_digest(given.encode(), expected.encode()):
                session["dashboard"] = True
                return redirect(url_for("rainier_sync.index"), code=303)
            abort(403)
        return render_template("login.html")

    return pages
