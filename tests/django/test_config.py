"""Booting from Django settings: every misconfiguration is an
ImproperlyConfigured naming the setting at fault, before anything runs."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from rainier_sync.django.conf import boot


def settings(tmp_path: pathlib.Path, **values: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db.sqlite3")}},
        "DEBUG": False,
    }
    base.update(values)
    return SimpleNamespace(**base)


def refused(config: SimpleNamespace) -> str:
    with pytest.raises(ImproperlyConfigured) as caught:
        boot(config, discover=False)
    return str(caught.value)


DATABASE = {"connections": {"main": {"driver": "database", "alias": "default"}}}


def test_both_queue_driver_and_a_section_are_refused(tmp_path: pathlib.Path) -> None:
    message = refused(settings(tmp_path, QUEUE_DRIVER="database", RAINIER_QUEUES=DATABASE))
    assert "QUEUE_DRIVER" in message and "RAINIER_QUEUES" in message and "both" in message


def test_neither_is_refused_when_the_app_is_installed(tmp_path: pathlib.Path) -> None:
    message = refused(settings(tmp_path))
    assert "RAINIER_QUEUES" in message and "QUEUE_DRIVER" in message


def test_a_misspelt_rainier_setting_is_refused_with_the_right_name(tmp_path: pathlib.Path) -> None:
    message = refused(settings(tmp_path, RAINIER_QUEUES=DATABASE, RAINIER_ON_COMIT=False))
    assert "settings.RAINIER_ON_COMIT" in message and "'RAINIER_ON_COMMIT'" in message


def test_an_alias_missing_from_databases_is_refused(tmp_path: pathlib.Path) -> None:
    section = {"connections": {"main": {"driver": "database", "alias": "replica"}}}
    message = refused(settings(tmp_path, RAINIER_QUEUES=section))
    assert "['main']" in message and "'replica'" in message and "DATABASES" in message


def test_an_alias_on_a_driver_other_than_database_is_refused(tmp_path: pathlib.Path) -> None:
    section = {"connections": {"fast": {"driver": "redis", "url": "redis://127.0.0.1:6379/0", "alias": "default"}}}
    message = refused(settings(tmp_path, RAINIER_QUEUES=section))
    assert "['fast']" in message and "'alias'" in message and "redis" in message


def test_a_default_naming_an_unknown_connection_is_refused(tmp_path: pathlib.Path) -> None:
    section = {"default": "mian", **DATABASE}
    message = refused(settings(tmp_path, RAINIER_QUEUES=section))
    assert "RAINIER_QUEUES" in message and "'mian'" in message and "'main'" in message


def test_an_unknown_connection_setting_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    section = {"connections": {"main": {"driver": "database", "alias": "default", "reservaton": 90}}}
    message = refused(settings(tmp_path, RAINIER_QUEUES=section))
    assert "RAINIER_QUEUES" in message and "'reservaton'" in message and "'reservation'" in message


def test_queue_driver_needs_the_settings_beside_it(tmp_path: pathlib.Path) -> None:
    message = refused(settings(tmp_path, QUEUE_DRIVER="redis"))
    assert "REDIS_URL" in message


def test_an_in_memory_sqlite_alias_is_refused(tmp_path: pathlib.Path) -> None:
    config = settings(tmp_path, RAINIER_QUEUES=DATABASE)
    config.DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    assert "in-memory" in refused(config)


def test_an_engine_the_driver_cannot_use_is_refused(tmp_path: pathlib.Path) -> None:
    config = settings(tmp_path, RAINIER_QUEUES=DATABASE)
    config.DATABASES = {"default": {"ENGINE": "django.db.backends.oracle", "NAME": "x"}}
    message = refused(config)
    assert "oracle" in message and "DATABASES['default']" in message


def test_rainier_on_commit_must_be_a_bool(tmp_path: pathlib.Path) -> None:
    assert "RAINIER_ON_COMMIT" in refused(settings(tmp_path, RAINIER_QUEUES=DATABASE, RAINIER_ON_COMMIT="no"))


def test_rainier_jobs_must_list_importable_modules(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="RAINIER_JOBS"):
        boot(settings(tmp_path, RAINIER_QUEUES=DATABASE, RAINIER_JOBS="shop.jobs"))
    with pytest.raises(ImproperlyConfigured, match="RAINIER_JOBS.*no_such_module"):
        boot(settings(tmp_path, RAINIER_QUEUES=DATABASE, RAINIER_JOBS=["no_such_module"]))


def test_rainier_jobs_registers_the_jobs_of_the_modules_it_lists(tmp_path: pathlib.Path) -> None:
    manager = boot(settings(tmp_path, RAINIER_QUEUES=DATABASE, RAINIER_JOBS=["tests.django.site.jobs"]))
    try:
        names = {cls.NAME for cls in manager.registry.classes()}
        assert {"site.write-note", "site.add-note", "site.record-pid"} <= names
    finally:
        manager.close()


def test_queue_driver_database_keeps_jobs_in_the_default_alias(tmp_path: pathlib.Path) -> None:
    manager = boot(settings(tmp_path, QUEUE_DRIVER="database", QUEUE_RESERVATION=120), discover=False)
    try:
        assert manager.aliases() == {"database": "default"}
        assert manager.connection("database").reservation == 120
    finally:
        manager.close()


def test_a_database_connection_without_alias_uses_the_default_alias(tmp_path: pathlib.Path) -> None:
    section = {"connections": {"main": {"driver": "database"}}}
    manager = boot(settings(tmp_path, RAINIER_QUEUES=section), discover=False)
    try:
        assert manager.aliases() == {"main": "default"}
    finally:
        manager.close()


def test_postgresql_and_mysql_entries_become_the_drivers_urls() -> None:
    from rainier_sync.django.conf import database_url

    databases = {
        "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app", "PASSWORD": "p@ss",
               "HOST": "db.internal", "PORT": "5433"},
        "my": {"ENGINE": "django.db.backends.mysql", "NAME": "shop", "USER": "root"},
    }  # fmt: skip
    assert database_url("pg", databases, "x") == "postgresql://app:p%40ss@db.internal:5433/shop"
    assert database_url("my", databases, "x") == "mysql://root@127.0.0.1/shop"


def test_a_socket_directory_host_is_refused(tmp_path: pathlib.Path) -> None:
    config = settings(tmp_path, RAINIER_QUEUES=DATABASE)
    config.DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "HOST": "/run/pg"}}
    assert "socket directory /run/pg" in refused(config)


def test_rainier_queues_may_be_the_path_of_a_toml_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text('[queues.connections.main]\ndriver = "database"\nalias = "default"\nreservation = 120\n')
    manager = boot(settings(tmp_path, RAINIER_QUEUES=str(path)), discover=False)
    try:
        assert manager.aliases() == {"main": "default"}
        assert manager.connection("main").reservation == 120
    finally:
        manager.close()


def test_a_worker_knows_the_tasks_of_each_app_when_tasks_use_the_backend(tmp_path: pathlib.Path) -> None:
    import os
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env.update(PYTHONPATH=str(root), TASKS_DB=str(tmp_path / "tasks.sqlite3"),
               DJANGO_SETTINGS_MODULE="tests.django.tasks_settings")  # fmt: skip
    code = (
        "import django; django.setup()\n"
        "from rainier_sync.django import get_manager\n"
        "print(sorted(cls.NAME for cls in get_manager().registry.classes()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tests.django.taskapp.tasks.ping" in done.stdout


@pytest.mark.parametrize("form", ["environment", "section"])
def test_the_store_the_settings_name_is_the_managers(tmp_path: pathlib.Path, form: str, redis_url: str) -> None:
    """QUEUE_LOCKS_URL (beside QUEUE_DRIVER) or the section's ``locks`` is the store the manager uses."""
    from rainier_sync.locks import RedisLockStore

    if form == "environment":
        config = settings(tmp_path, QUEUE_DRIVER="memory", QUEUE_LOCKS_URL=redis_url)
    else:
        config = settings(tmp_path, RAINIER_QUEUES={**DATABASE, "locks": redis_url})
    manager = boot(config, discover=False)
    try:
        assert isinstance(manager.locks, RedisLockStore), manager.locks
    finally:
        manager.close()
