"""manage.py queue mirrors rainier-sync (same commands, options, output and
exit codes), manage.py check reports rainier-sync check's findings, and a
misconfiguration stops Django at startup."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROJECT = ROOT / "examples" / "django_app"
TIMEOUT = 120


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SHOP_", "DJANGO_", "RAINIER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(ROOT)])
    env["SHOP_DB_NAME"] = str(tmp_path_factory.mktemp("shop") / "shop.sqlite3")
    done = run(env, "manage.py", "migrate", "--no-input")
    assert done.returncode == 0, done.stderr
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=PROJECT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)  # fmt: skip


def both(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """``manage.py queue ARGS`` and the same through ``rainier-sync --app``."""
    django_name = args[0].removeprefix("queue:").replace(":", "-")
    if args[0] == "outbox:relay":
        django_name = "relay"
    managed = run(env, "manage.py", "queue", django_name, *args[1:])
    plain = run(env, "-m", "rainier_sync", "--app", "tests.django.cli_app:manager", *args)
    return managed, plain


@pytest.mark.parametrize(
    "args",
    [
        ("queue:status",),
        ("queue:failed",),
        ("queue:failed", "no-such-id"),
        ("queue:retry", "no-such-id"),
        ("queue:forget", "no-such-id"),
        ("queue:reclaim",),
        ("queue:work", "--once", "--max-jobs=1"),
        ("queue:work", "--max-jobs=lots"),
        ("queue:work", "--no-such-option"),
        ("queue:pause", "mail"),
        ("queue:continue", "mail"),
        ("queue:health", "--health-file", "/nonexistent/health", "--max-age", "5"),
        ("schedule:list",),
        ("queue:migrate",),
        ("check",),
    ],
)
def test_manage_py_queue_answers_as_rainier_sync_does(shop: dict[str, str], args: tuple[str, ...]) -> None:
    managed, plain = both(shop, *args)
    assert managed.returncode == plain.returncode, (managed.stderr, plain.stderr)
    command = args[0]
    typed = "manage.py queue " + command.removeprefix("queue:").replace(":", "-")
    assert managed.stdout == plain.stdout.replace(f"rainier-sync {command}", typed)
    if plain.stderr.startswith("rainier-sync"):
        assert managed.stderr.startswith("manage.py queue"), managed.stderr
        assert "Traceback" not in managed.stderr


def test_the_help_lists_every_command(shop: dict[str, str]) -> None:
    from rainier_sync.cli.parser import COMMANDS

    done = run(shop, "manage.py", "queue", "--help")
    assert done.returncode == 0
    for command in COMMANDS:
        assert f"(rainier-sync {command})" in done.stdout
    work = run(shop, "manage.py", "queue", "work", "--help")
    assert work.returncode == 0 and "--once" in work.stdout and "--concurrency" in work.stdout


def test_an_unknown_command_or_none_is_a_usage_error(shop: dict[str, str]) -> None:
    unknown = run(shop, "manage.py", "queue", "wrok")
    assert unknown.returncode == 2 and "unknown command 'wrok'" in unknown.stderr and "'work'" in unknown.stderr
    assert run(shop, "manage.py", "queue").returncode == 2


def test_djangos_own_options_are_taken_by_manage_py(shop: dict[str, str]) -> None:
    done = run(shop, "manage.py", "queue", "status", "--settings=shop.settings")
    assert done.returncode == 0, done.stderr
    assert "main" in done.stdout


def test_check_with_a_database_warns_of_tables_not_created_yet(tmp_path: pathlib.Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SHOP_", "DJANGO_", "RAINIER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(ROOT)])
    env["SHOP_DB_NAME"] = str(tmp_path / "unmigrated.sqlite3")
    done = run(env, "manage.py", "check", "--database", "default")
    assert done.returncode == 0, done.stderr
    assert "rainier_sync.W001" in done.stderr and "manage.py migrate" in done.stderr
    static = run(env, "manage.py", "check")
    assert static.returncode == 0 and "rainier_sync" not in static.stderr + static.stdout


def test_a_misspelt_setting_stops_django_at_startup(tmp_path: pathlib.Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "django", "check", "--settings=tests.django.misspelt_settings"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 1
    assert "ImproperlyConfigured: settings.RAINIER_QUEUS is not a rainier_sync setting" in done.stderr
    assert "'RAINIER_QUEUES'" in done.stderr


# -- in this process, on the test site ----------------------------------------------------------


def test_call_command_runs_a_queue_command(django_site: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management import CommandError, call_command

    call_command("queue", "status")
    assert "sqlite" in capsys.readouterr().out
    with pytest.raises(CommandError) as failed:
        call_command("queue", "retry", "no-such-id")
    assert failed.value.returncode == 1


def test_system_checks_report_the_findings(django_site: dict[str, Any]) -> None:
    from dataclasses import dataclass

    from django.core import checks

    from rainier_sync import Job, JobContext, JobRegistry

    manager = django_site["manager"]
    ours = [message for message in checks.run_checks(databases=["default"]) if message.id.startswith("rainier_sync")]
    assert ours == []

    @dataclass
    class Slow(Job):
        NAME = "site.slow-check"
        TIMEOUT = 600

        def handle(self, context: JobContext) -> None:
            pass

    registry = manager.registry
    manager.registry = JobRegistry().with_job(Slow)
    try:
        found = [message for message in checks.run_checks() if message.id.startswith("rainier_sync")]
    finally:
        manager.registry = registry
    assert found and all(message.level == checks.ERROR for message in found)
    assert any("site.slow-check" in message.msg and "TIMEOUT 600s" in message.msg for message in found)
