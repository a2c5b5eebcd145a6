"""RainierSync on a Flask app: conventions, config, app context in jobs, commands."""

from __future__ import annotations

import os
import pathlib
import re
import secrets
import threading
import time

import pytest
from flask import Flask

import rainier_sync
from rainier_sync import ConfigurationError, NoQueueConfiguredError, QueueManager, WorkerOptions
from rainier_sync.drivers import DatabaseQueue, MemoryQueue
from rainier_sync.flask import EXTENSION_KEY, FlaskWorker, RainierSync, get_state

from .apps import SEEN, Explode, RecordApp, TimedReport, fail_jobs, make_app, registry


def test_state_lives_in_app_extensions_and_one_extension_serves_two_apps() -> None:
    ext = RainierSync(authorize=lambda: True)
    apps = [Flask("one"), Flask("two")]
    for app in apps:
        app.secret_key = secrets.token_hex(32)
        ext.init_app(app, manager=QueueManager(connections={"m": MemoryQueue()}, registry=registry()))
    assert not any(isinstance(value, Flask) for value in vars(ext).values())
    one, two = (get_state(app).manager for app in apps)
    assert one is not two
    assert apps[0].extensions[EXTENSION_KEY].manager is one
    with apps[1].app_context():
        assert ext.manager is two
        assert rainier_sync.instance() is two
    with apps[0].app_context():
        assert rainier_sync.instance() is one
    with pytest.raises(RuntimeError, match="already set up"):
        ext.init_app(apps[0])


def test_instance_outside_an_app_context_is_the_process_wide_one() -> None:
    make_app()
    with pytest.raises(NoQueueConfiguredError):
        rainier_sync.instance()
    process_wide = QueueManager(connections={"x": MemoryQueue()})
    rainier_sync.set_instance(process_wide)
    assert rainier_sync.instance() is process_wide


def test_dispatch_in_a_request_goes_to_the_apps_manager() -> None:
    app, manager = make_app()

    @app.post("/send")
    def send() -> str:
        return rainier_sync.dispatch(RecordApp("from-request")) or ""

    job_id = app.test_client().post("/send").get_data(as_text=True)
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    assert [job.id for job in driver.jobs] == [job_id]


def test_every_job_runs_in_a_fresh_app_context_that_resolves_flask() -> None:
    app, manager = make_app(name="context_app", GREETING="hello")
    for label in ("first", "second", "third"):
        manager.dispatch(RecordApp(label))
    worker = FlaskWorker(app, options=WorkerOptions(once=True, concurrency=1))
    result: list[object] = []
    # Run from a thread with no app context of its own, as a worker process would.
    thread = threading.Thread(target=lambda: result.append(worker.run()))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert worker.stats.processed == 3
    assert sorted(s["label"] for s in SEEN) == ["first", "second", "third"]
    for seen in SEEN:
        assert seen["app"] == "context_app"
        assert seen["greeting"] == "hello"
        assert seen["resolved_app"] == "context_app"
        assert seen["g_before"] is None, "flask.g leaked from one job to the next"


def test_failed_hook_and_failures_run_in_the_app_context_too() -> None:
    app, manager = make_app()
    fail_jobs(manager, "boom")
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    [failed] = driver.failed
    assert failed.error == "RuntimeError: boom"
    # The worker path: an app-context job failing is recorded, and the worker carries on.
    manager.dispatch(Explode("again"))
    manager.dispatch(RecordApp("after"))
    stats = FlaskWorker(app, options=WorkerOptions(queues=["mail", "default"], once=True)).run()
    assert (stats.failed, stats.processed) == (1, 1)


def test_a_timed_attempt_in_a_child_process_sees_the_app_and_failed_runs_in_one() -> None:
    app, manager = make_app(name="timed_app")
    manager.dispatch(TimedReport())
    stats = FlaskWorker(app, options=WorkerOptions(once=True, concurrency=1)).run()
    assert stats.failed == 1
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    assert driver.failed[0].error == "RuntimeError: child saw app timed_app"
    assert SEEN == [{"label": "failed-hook", "app": "timed_app"}]


def test_queue_driver_in_app_config_boots_the_queue_from_app_config(tmp_path: pathlib.Path) -> None:
    app = Flask("from_config")
    app.config.update(QUEUE_DRIVER="database", DATABASE_URL=f"sqlite:///{tmp_path / 'jobs.sqlite3'}")
    RainierSync(app, registry=registry())
    manager = get_state(app).manager
    try:
        driver = manager.connection()
        assert isinstance(driver, DatabaseQueue)
        assert (manager.default, driver.dialect) == ("database", "sqlite")
        driver.migrate()
        with app.app_context():
            job_id = rainier_sync.dispatch(RecordApp("configured"))
        assert FlaskWorker(app, options=WorkerOptions(once=True)).run().processed == 1
        assert SEEN[0]["app"] == "from_config" and job_id
    finally:
        manager.close()


def test_settings_come_from_app_config_not_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "sqlite:///from-the-environment.sqlite3")
    app = Flask("no_url")
    app.config["QUEUE_DRIVER"] = "database"
    with pytest.raises(ConfigurationError, match="DATABASE_URL is not set"):
        RainierSync(app)


def test_a_rainier_queues_section_in_app_config() -> None:
    app = Flask("sectioned")
    app.config["RAINIER_QUEUES"] = {
        "default": "fast",
        "connections": {"fast": {"driver": "memory"}, "other": {"driver": "memory"}},
    }
    RainierSync(app, registry=registry())
    manager = get_state(app).manager
    assert manager.default == "fast"
    assert sorted(manager.connections) == ["fast", "other"]
    assert all(isinstance(d, MemoryQueue) for d in manager.connections.values())


def test_a_rainier_queues_toml_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text('default = "jobs"\n\n[connections.jobs]\ndriver = "memory"\n')
    app = Flask("toml")
    app.config["RAINIER_QUEUES"] = str(path)
    RainierSync(app, registry=registry())
    assert isinstance(get_state(app).manager.connection("jobs"), MemoryQueue)


def test_a_config_mistake_fails_at_boot_naming_it() -> None:
    app = Flask("typo")
    app.config["QUEUE_DRIVER"] = "memroy"
    with pytest.raises(ConfigurationError, match="QUEUE_DRIVER=memroy"):
        RainierSync(app)


def test_explicit_manager_and_config_together_fail_at_boot() -> None:
    app = Flask("both")
    app.config["QUEUE_DRIVER"] = "memory"
    with pytest.raises(ConfigurationError, match="QUEUE_DRIVER"):
        RainierSync(app, manager=QueueManager(connections={"m": MemoryQueue()}))


def test_queue_driver_and_a_queues_section_together_fail_at_boot() -> None:
    app = Flask("both")
    section = {"default": "m", "connections": {"m": {"driver": "memory"}}}
    app.config.update(QUEUE_DRIVER="memory", RAINIER_QUEUES=section)
    with pytest.raises(ConfigurationError, match="QUEUE_DRIVER and RAINIER_QUEUES"):
        RainierSync(app)


def test_no_queue_configured_gives_a_manager_that_says_so() -> None:
    app = Flask("nothing")
    RainierSync(app, registry=registry())
    with app.app_context(), pytest.raises(NoQueueConfiguredError):
        rainier_sync.dispatch(RecordApp("x"))


def test_arguments_that_would_be_ignored_or_are_malformed_are_refused() -> None:
    with pytest.raises(TypeError, match="registry would be ignored"):
        RainierSync(Flask("ignored"), manager=QueueManager(), registry=registry())
    with pytest.raises(ValueError, match="dashboard_url must be a path"):
        RainierSync(Flask("relative"), manager=QueueManager(), dashboard_url="queues")


def test_manager_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="QueueManager"):
        RainierSync(Flask("bad"), manager="memory")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="authorize"):
        RainierSync(Flask("bad2"), manager=QueueManager(), authorize="yes")  # type: ignore[arg-type]


def test_embedded_worker_thread_runs_jobs_dispatched_later() -> None:
    app, manager = make_app(name="embedded")
    ext = RainierSync()
    worker = ext.start_worker(app, concurrency=2, sleep=0.2)
    try:
        with app.app_context():
            rainier_sync.dispatch(RecordApp("embedded"))
        from tests.support import wait_until

        wait_until(lambda: worker.stats.processed == 1, timeout=10, message="the embedded worker to run the job")
    finally:
        worker.stop()
        worker.join(10)
    assert SEEN[0]["app"] == "embedded"
    assert get_state(app).workers == [worker]


# -- commands ---------------------------------------------------------------------------------
def test_queue_work_once_runs_jobs_in_the_app_context(caplog: pytest.LogCaptureFixture) -> None:
    app, manager = make_app(name="cli_app")
    manager.dispatch(RecordApp("cli"))
    result = app.test_cli_runner().invoke(args=["queue", "work", "--once", "--queue", "default"])
    assert result.exit_code == 0, result.output
    assert "worker stopped: 1 processed, 0 released, 0 failed" in caplog.messages  # logged as rainier-sync logs it
    assert SEEN[0]["app"] == "cli_app"


def test_queue_work_touches_its_health_file_and_queue_health_reads_it(tmp_path: pathlib.Path) -> None:
    app, manager = make_app(name="cli_app")
    manager.dispatch(RecordApp("cli"))
    health = tmp_path / "worker.alive"
    runner = app.test_cli_runner()
    assert runner.invoke(args=["queue", "health", "--health-file", str(health)]).exit_code == 1
    result = runner.invoke(args=["queue", "work", "--once", "--health-file", str(health)])
    assert result.exit_code == 0, result.output
    assert health.exists() and SEEN[0]["app"] == "cli_app"
    probe = runner.invoke(args=["queue", "health", "--health-file", str(health), "--max-age", "60"])
    assert probe.exit_code == 0 and "healthy: health file" in probe.output, probe.output
    os.utime(health, (time.time() - 120, time.time() - 120))
    stale = runner.invoke(args=["queue", "health", "--health-file", str(health), "--max-age", "60"])
    assert stale.exit_code == 1 and "more than --max-age 60s" in stale.output, stale.output


def test_queue_status_failed_retry_forget_reclaim() -> None:
    app, manager = make_app()
    first, second = fail_jobs(manager, "one", "two")
    manager.dispatch(RecordApp("waiting"))
    runner = app.test_cli_runner()

    status = runner.invoke(args=["queue", "status"])
    assert status.exit_code == 0, status.output
    assert re.search(r"^primary\s+memory\s+default\s+1\s+0\s+0\s+1\s+2$", status.output, re.M), status.output

    listed = runner.invoke(args=["queue", "failed"])
    assert listed.exit_code == 0
    assert first in listed.output and "RuntimeError: one" in listed.output

    retried = runner.invoke(args=["queue", "retry", first])
    assert retried.exit_code == 0, retried.output
    assert f"Queued failed job {first} again on connection primary." in retried.output
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    assert [f.id for f in driver.failed] == [second]
    assert first in [job.id for job in driver.jobs]

    missing = runner.invoke(args=["queue", "retry", "nope"])
    assert missing.exit_code == 1
    assert "no failed job has id 'nope'" in missing.output

    forgot = runner.invoke(args=["queue", "forget", second])
    assert forgot.exit_code == 0
    assert driver.failed == []
    assert runner.invoke(args=["queue", "forget", second]).exit_code == 1

    reclaimed = runner.invoke(args=["queue", "reclaim"])
    assert reclaimed.exit_code == 0
    assert "primary (memory): 0 lapsed reservation(s) reclaimed" in reclaimed.output


def test_queue_retry_all_and_unknown_connection() -> None:
    app, manager = make_app()
    fail_jobs(manager, "a", "b", "c")
    runner = app.test_cli_runner()
    result = runner.invoke(args=["queue", "retry", "all"])
    assert result.exit_code == 0
    assert "Queued 3 failed job(s) again." in result.output
    for args in (["queue", "status", "--connection", "nowhere"], ["queue", "work", "--connection", "nowhere"]):
        unknown = runner.invoke(args=args)
        assert unknown.exit_code == 2, "an undeclared connection is a usage error, as for rainier-sync"
        assert "'nowhere' is not declared" in unknown.output


def test_queue_work_refuses_bad_options_with_a_usage_error() -> None:
    app, _ = make_app()
    runner = app.test_cli_runner()
    for args in (["--concurrency", "0"], ["--sleep", "soon"], ["--no-such-option"]):
        result = runner.invoke(args=["queue", "work", *args])
        assert result.exit_code == 2, result.output
        assert "flask queue: error:" in result.output
    assert "--concurrency" in runner.invoke(args=["queue", "work", "--concurrency", "0"]).output


def test_queue_work_with_an_empty_registry_is_a_usage_error() -> None:
    app, _ = make_app(manager=QueueManager(connections={"m": MemoryQueue()}))
    result = app.test_cli_runner().invoke(args=["queue", "work", "--once"])
    assert result.exit_code == 2
    assert "the job registry is empty" in result.output


def test_queue_migrate_with_no_database_connection_says_so() -> None:
    app, _ = make_app()
    result = app.test_cli_runner().invoke(args=["queue", "migrate"])
    assert result.exit_code == 0
    assert "primary (memory): nothing to migrate" in result.output


def test_queue_migrate_on_the_database_driver(tmp_path: pathlib.Path) -> None:
    app = Flask("migrating")
    app.config.update(QUEUE_DRIVER="database", DATABASE_URL=f"sqlite:///{tmp_path / 'jobs.sqlite3'}")
    RainierSync(app, registry=registry())
    runner = app.test_cli_runner()
    first = runner.invoke(args=["queue", "migrate"])
    assert first.exit_code == 0, first.output
    assert "database (database): applied migration(s)" in first.output


def test_a_backend_error_in_a_command_is_one_line_and_exit_code_1() -> None:
    """A backend that raises stands in for one that does not answer (a stub: no real server is down on purpose)."""

    class Down(MemoryQueue):
        def reclaim_expired(self) -> int:
            raise ConnectionError("connection refused")

    app, _ = make_app(manager=QueueManager(connections={"down": Down()}))
    result = app.test_cli_runner().invoke(args=["queue", "reclaim"])
    assert result.exit_code == 1
    assert result.output.strip() == "flask queue: error: ConnectionError: connection refused (-v shows the traceback)"


def test_without_flask_installed_the_error_names_the_extra() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['flask'] = None\n"
        "import rainier_sync\n"
        "try:\n"
        "    import rainier_sync.flask\n"
        "except rainier_sync.errors.DriverUnavailableError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'rainier_sync[flask]'" in done.stdout
