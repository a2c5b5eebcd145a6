"""The dashboard's secret key: it refuses a missing key or one the project has
published, and the example app refuses to start without one of its own."""

from __future__ import annotations

import os
import pathlib
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from rainier_sync import ConfigurationError, QueueManager
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask import SHIPPED_SECRET_KEYS, RainierSync, get_state
from rainier_sync.flask.dashboard import CSRF_SESSION_KEY

from .apps import fail_jobs, make_app, registry

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: The key examples/flask_app fell back to when SECRET_KEY was not set.
OLD_EXAMPLE_KEY = "development only: set SECRET_KEY"


# -- the secret keys the repository ships ---------------------------------------------------
_NAME = r"(?<![A-Za-z0-9_])(?:SECRET_KEY|secret_key)"
# A quoted literal after the name and "=", ":" or "," (a keyword argument, an assignment to the config or to
# app.secret_key, a getenv default, a dict entry, an annotated class attribute), bytes too.
_QUOTED = re.compile(
    _NAME + r"""["']?\]?\s*(?::\s*[A-Za-z_][\w.]*\s*)?[=:,]\s*[bBuUrR]{0,2}(?P<q>["'])(?P<value>.*?)(?P=q)"""
)
# The literals in a list or tuple of fallback keys.
_FALLBACKS = re.compile(_NAME + r"""_FALLBACKS["']?\]?\s*[=:,]\s*[\[(](?P<body>[^\])]*)[\])]""")
_STRING = re.compile(r"""[bBuUrR]{0,2}(?P<q>["'])(?P<value>.*?)(?P=q)""")
# Shell and .env files: an unquoted word after "=" (not a Python name followed by "," or ")", nor "$(...)").
_SHELL = re.compile(_NAME + r"""=(?P<value>[^\s"'`$<>()\[\],{}]+)(?=\s|$)""", re.M)
_SKIP_DIRS = {"node_modules", "__pycache__", "build", "dist", "_build", "htmlcov"}
_TEXT = {".py", ".pyi", ".rst", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".html", ".env", ".yml", ".yaml",
         ".json", ".example", ".conf", ".j2", ""}


def secret_key_literals(text: str, *, python: bool) -> set[str]:
    """Every literal secret key (or fallback key) written in ``text``."""
    found: set[str] = set()
    for match in _QUOTED.finditer(text):
        value = match.group("value")
        if python or not value.startswith("$"):  # "$VAR" or "$(...)" outside Python is the shell's expansion
            found.add(value)
    for match in _FALLBACKS.finditer(text):
        found.update(m.group("value") for m in _STRING.finditer(match.group("body")))
    if not python:
        found.update(match.group("value") for match in _SHELL.finditer(text))
    return found


def shipped_secret_keys() -> dict[str, list[str]]:
    """Each literal secret key in the repository's files, with where it is written."""
    where: dict[str, list[str]] = {}
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = pathlib.Path(directory, name)
            if path.suffix not in _TEXT or path.stat().st_size > 2_000_000:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for value in secret_key_literals(text, python=path.suffix in (".py", ".pyi")):
                where.setdefault(value, []).append(str(path.relative_to(ROOT)))
    return where


def test_the_scan_finds_every_way_of_writing_a_secret_key() -> None:
    name = "SECRET" + "_KEY"  # spelt in two pieces so the repository scan does not read these samples
    python = "\n".join(
        [
            f'app.config.update({name}="one", TESTING=True)',
            f"app.config['{name}'] = 'two'",
            f'os.environ.get("{name}", "three")',
            f'{{"{name}": "four"}}',
            f'app.{name.lower()} = b"five"',
            f'    {name}: str = "six"',
            f'{name}_FALLBACKS = ["seven", "eight"]',
            f'app.config.update({name}=os.environ["{name}"], DEBUG=False)',
            f"app.config.update({name}=key)",
        ]
    )
    assert secret_key_literals(python, python=True) == {"one", "two", "three", "four", "five", "six", "seven", "eight"}
    shell = "\n".join(
        [
            f"   $ {name}=nine flask --app x run",
            f"export {name}=ten",
            f'{name}="eleven"',
            f"export {name}=$(python -c 'import secrets; print(secrets.token_hex())')",
            f'export {name}="$(openssl rand -hex 32)"',
            f'       {name}=os.environ["{name}"],',
            f"       {name}=key,",
            f"set ``{name}`` to a long random value",
        ]
    )
    assert secret_key_literals(shell, python=False) == {"nine", "ten", "eleven"}


def test_every_secret_key_the_repository_ships_is_refused() -> None:
    shipped = shipped_secret_keys()
    not_refused = {key: paths for key, paths in shipped.items() if key and key not in SHIPPED_SECRET_KEYS}
    assert not not_refused, (
        "these secret keys are written in the repository but rainier_sync.flask.SHIPPED_SECRET_KEYS does not "
        f"refuse them: {not_refused}"
    )


# -- the extension refuses to serve with such a key -------------------------------------------
def dashboard_app(key: object, **extra: object) -> Flask:
    app = Flask("keyed")
    app.config.update(SECRET_KEY=key, **extra)
    RainierSync(app, manager=QueueManager(connections={"m": MemoryQueue()}, registry=registry()),
                authorize=lambda: True)
    return app


@pytest.mark.parametrize("key", sorted(SHIPPED_SECRET_KEYS) + [OLD_EXAMPLE_KEY.encode()])
def test_a_published_secret_key_fails_at_boot(key: str | bytes) -> None:
    with pytest.raises(ConfigurationError, match=r"SECRET_KEY.*published with rainier_sync") as raised:
        dashboard_app(key)
    assert "dashboard_url=None" in str(raised.value)


@pytest.mark.parametrize("key", [None, "", b"", "   "])
def test_no_secret_key_fails_at_boot(key: object) -> None:
    with pytest.raises(ConfigurationError, match=r"SECRET_KEY.* not set"):
        dashboard_app(key)


def test_a_published_fallback_key_fails_at_boot() -> None:
    with pytest.raises(ConfigurationError, match=r"SECRET_KEY_FALLBACKS.*published with rainier_sync"):
        dashboard_app(secrets.token_hex(32), SECRET_KEY_FALLBACKS=[secrets.token_hex(32), "test-secret"])


def test_a_secret_key_is_not_needed_where_the_dashboard_serves_nothing() -> None:
    for app, options in ((Flask("unmounted"), {"authorize": lambda: True, "dashboard_url": None}),
                         (Flask("unauthorised"), {})):
        RainierSync(app, manager=QueueManager(connections={"m": MemoryQueue()}), **options)  # type: ignore[arg-type]
        assert get_state(app).manager is not None


def _failed_app() -> tuple[Flask, QueueManager, str, FlaskClient, str]:
    app, manager = make_app(authorize=lambda: True)
    [job_id] = fail_jobs(manager, "keep me failed")
    client = app.test_client()
    page = client.get("/queues/").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None
    return app, manager, job_id, client, token.group(1)


@pytest.mark.parametrize("key", [None, "", OLD_EXAMPLE_KEY, "test-secret"])
def test_a_key_changed_after_boot_turns_every_request_away_saying_why(key: str | None) -> None:
    app, manager, job_id, client, token = _failed_app()
    app.config["SECRET_KEY"] = key
    paths = ["/queues/", f"/queues/primary/failed/{job_id}", "/queues/static/dashboard.css"]
    for response in [client.get(path) for path in paths] + [
        client.post(f"/queues/primary/failed/{job_id}/retry", data={"csrf_token": token}),
        client.post(f"/queues/primary/failed/{job_id}/forget", headers={"X-CSRF-Token": token}),
        client.post("/queues/primary/retry-failed", data={"csrf_token": token}),
    ]:
        assert response.status_code == 503, response.request.path
        text = response.get_data(as_text=True)
        assert "The queue dashboard is turned off" in text and "SECRET_KEY" in text
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    assert [failed.id for failed in driver.failed] == [job_id], "a refused POST changed something"


def test_a_published_fallback_key_set_after_boot_turns_requests_away() -> None:
    app, _, job_id, client, token = _failed_app()
    app.config["SECRET_KEY_FALLBACKS"] = [OLD_EXAMPLE_KEY]
    assert client.get("/queues/").status_code == 503
    assert client.post(f"/queues/primary/failed/{job_id}/retry", data={"csrf_token": token}).status_code == 503


def test_a_key_changed_after_boot_is_still_403_without_authorisation() -> None:
    app, _ = make_app()
    app.config["SECRET_KEY"] = OLD_EXAMPLE_KEY
    assert app.test_client().get("/queues/").status_code == 403


# -- the forged-cookie attack on the example app ------------------------------------------------
def forged_session(key: str, **values: object) -> str:
    """A session cookie signed with ``key``, made the way Flask makes its own."""
    forger = Flask("forger")
    forger.secret_key = key
    serializer = forger.session_interface.get_signing_serializer(forger)  # type: ignore[attr-defined]
    assert serializer is not None
    cookie: str = serializer.dumps(dict(values))
    return cookie


def attack(app: Flask, key: str, job_id: str) -> tuple[int, int]:
    """GET the dashboard and POST a retry with a session forged with ``key``."""
    client = app.test_client()
    client.set_cookie(app.config["SESSION_COOKIE_NAME"], forged_session(key, dashboard=True, **{CSRF_SESSION_KEY: "t"}))
    seen = client.get("/queues/").status_code
    retried = client.post(f"/queues/database/failed/{job_id}/retry", data={"csrf_token": "t"}).status_code
    return seen, retried


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("APP_DATABASE", "DASHBOARD_PASSWORD", "EMBEDDED_WORKER", "FLASK_DEBUG", "SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def example(tmp_path: pathlib.Path, clean_environ: None) -> Iterator[Flask]:
    from examples.flask_app import create_app

    app = create_app({"APP_DATABASE": str(tmp_path / "app.sqlite3"), "DASHBOARD_PASSWORD": "pw", "TESTING": True})
    yield app
    get_state(app).manager.close()


def test_a_session_forged_with_the_old_example_key_opens_nothing(example: Flask) -> None:
    assert example.secret_key not in SHIPPED_SECRET_KEYS
    assert attack(example, OLD_EXAMPLE_KEY, "some-job") == (403, 403)
    # The same forgery with the app's real key would work: only the key stands in the way.
    real = example.secret_key
    assert isinstance(real, str)
    assert attack(example, real, "some-job") == (200, 303)


def test_the_example_started_with_a_published_key_refuses_to_boot(
    tmp_path: pathlib.Path, clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.flask_app import create_app

    monkeypatch.setenv("SECRET_KEY", OLD_EXAMPLE_KEY)
    with pytest.raises(ConfigurationError, match="SECRET_KEY"):
        create_app({"APP_DATABASE": str(tmp_path / "app.sqlite3")})


# -- the example app needs a SECRET_KEY of its own -------------------------------------------------
def test_the_example_refuses_to_start_without_secret_key(tmp_path: pathlib.Path, clean_environ: None) -> None:
    from examples.flask_app import create_app

    with pytest.raises(RuntimeError, match="SECRET_KEY is not set"):
        create_app({"APP_DATABASE": str(tmp_path / "app.sqlite3")})
    assert not (tmp_path / "app.sqlite3").exists(), "it refused before touching anything"


def test_the_example_takes_secret_key_from_the_environment(
    tmp_path: pathlib.Path, clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.flask_app import create_app

    key = secrets.token_hex(32)
    monkeypatch.setenv("SECRET_KEY", key)
    app = create_app({"APP_DATABASE": str(tmp_path / "app.sqlite3")})
    assert app.secret_key == key
    get_state(app).manager.close()


def test_debug_and_testing_runs_make_up_a_throwaway_key(
    tmp_path: pathlib.Path, clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.flask_app import create_app

    testing = [create_app({"APP_DATABASE": str(tmp_path / f"t{n}.sqlite3"), "TESTING": True}) for n in range(2)]
    monkeypatch.setenv("FLASK_DEBUG", "1")
    debug = create_app({"APP_DATABASE": str(tmp_path / "debug.sqlite3")})
    keys = [app.secret_key for app in [*testing, debug]]
    assert len(set(keys)) == 3, "every run has a key of its own"
    for app, key in zip([*testing, debug], keys, strict=True):
        assert isinstance(key, str) and len(key) >= 32 and key not in SHIPPED_SECRET_KEYS
        get_state(app).manager.close()


def test_the_example_cli_without_secret_key_fails_naming_it(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FLASK_DEBUG", "SECRET_KEY")}
    env["APP_DATABASE"] = str(tmp_path / "app.sqlite3")
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "examples.flask_app", "queue", "status"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "SECRET_KEY is not set" in done.stderr, done.stderr
    assert not (tmp_path / "app.sqlite3").exists()
