"""examples/django_app end to end, in subprocesses of its own: migrate, a
request that writes an order and dispatches its receipt in one atomic(),
manage.py queue work --once; and the out-of-stock request that rolls back,
leaving neither the order nor its job. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from tests.django.support import mysql_database, postgres_database

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "django_app"
TIMEOUT = 120

REQUESTS = """
import json
from django.test import Client
client = Client(HTTP_HOST="localhost")
kept = client.post("/orders/", {"item": "tea"})
dropped = client.post("/orders/", {"item": "gin", "stock": "0"})
print(json.dumps({"kept": [kept.status_code, kept.json()], "dropped": [dropped.status_code, dropped.json()]}))
"""

STATE = """
import json
from orders.models import Order, Receipt
from rainier_sync.django import get_manager
queue = get_manager().connection("main")
print(json.dumps({
    "orders": sorted(Order.objects.values_list("item", "confirmed")),
    "receipts": sorted(Receipt.objects.values_list("text", flat=True)),
    "queued": queue.size("default"),
    "failed": len(queue.failed_jobs(10)),
}))
"""


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def shell(env: dict[str, str], code: str) -> Any:
    done = manage(env, "shell", "--no-imports", "-c", code)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def project_env(request: pytest.FixtureRequest, engine: str, tmp_path: pathlib.Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SHOP_", "DJANGO_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["SHOP_DATABASE"] = engine
    if engine == "sqlite":
        env["SHOP_DB_NAME"] = str(tmp_path / "shop.sqlite3")
        return env
    entry = postgres_database(request, "example") if engine == "postgresql" else mysql_database(request, "example")
    env.update(
        SHOP_DB_NAME=entry["NAME"],
        SHOP_DB_HOST=entry["HOST"],
        SHOP_DB_PORT=entry["PORT"],
        SHOP_DB_USER=entry["USER"],
        SHOP_DB_PASSWORD=entry["PASSWORD"],
    )
    return env


@pytest.mark.parametrize(
    "engine",
    ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres), pytest.param("mysql", marks=pytest.mark.mysql)],
)
def test_the_example_shop_end_to_end(request: pytest.FixtureRequest, engine: str, tmp_path: pathlib.Path) -> None:
    env = project_env(request, engine, tmp_path)
    migrated = manage(env, "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying rainier_sync.0001_initial... OK" in migrated.stdout

    answers = shell(env, REQUESTS)
    assert answers["kept"][0] == 201 and isinstance(answers["kept"][1]["job"], str)
    assert answers["dropped"][0] == 409
    before = shell(env, STATE)
    assert before == {"orders": [["tea", False]], "receipts": [], "queued": 1, "failed": 0}

    worked = manage(env, "queue", "work", "--once")
    assert worked.returncode == 0, worked.stderr
    assert "1 processed" in worked.stderr

    after = shell(env, STATE)
    assert after == {
        "orders": [["tea", True]],
        "receipts": ["Thank you for your order of tea"],
        "queued": 0,
        "failed": 0,
    }
