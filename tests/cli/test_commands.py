"""The commands, run in this process through ``main()`` against the memory driver."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import pytest
from freezegun import freeze_time

import rainier_sync
from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, main
from rainier_sync.drivers import MemoryQueue
from rainier_sync.locks import MemoryLockStore

from . import app

APP = "--app=tests.cli.app:current_manager"


def fail_some(driver: MemoryQueue, count: int, queue: str = "mail") -> list[str]:
    manager = app.current
    assert manager is not None
    ids = []
    for n in range(count):
        manager.dispatch_on(queue, app.Broken(n=n))
        reserved = driver.reserve([queue])
        assert reserved is not None
        driver.fail(reserved, RuntimeError(f"broken job {n}"))
        ids.append(reserved.id)
    return ids


def test_without_a_command_it_prints_help_and_exits_as_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "queue:work" in captured.err
    assert captured.err.rstrip().endswith("rainier-sync: error: no command given (see rainier-sync --help)")


def test_main_puts_the_logger_back(memory: MemoryQueue) -> None:
    import logging

    logger = logging.getLogger("rainier_sync")
    before = (logger.level, list(logger.handlers))
    assert main(["queue:status", APP, "-v"]) == EXIT_OK
    assert main(["queue:work", "--quiet", "--once", APP]) == EXIT_OK
    assert (logger.level, list(logger.handlers)) == before


def test_status_lists_every_queue_with_its_counts(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    manager = app.current
    assert manager is not None
    with freeze_time("2026-01-01 12:00:00"):
        manager.dispatch(app.Touch(n=1))
        manager.dispatch(app.Touch(n=2))
        manager.dispatch_after(60, app.Touch(n=3))
        assert memory.reserve(["default"]) is not None
        fail_some(memory, 1)
        assert main(["queue:status", APP, "--queue=high"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CONNECTION", "DRIVER", "QUEUE", "READY", "DELAYED", "RESERVED", "TOTAL", "FAILED"]
    table = lines[: lines.index("")]  # the workers follow, recorded in the memory queue's own store
    rows = {line.split()[2]: line.split() for line in table[1:]}
    assert rows["high"] == ["main", "memory", "high", "0", "0", "0", "0", "1"]
    assert rows["default"] == ["main", "memory", "default", "1", "1", "1", "3"]
    assert lines[len(table) + 1 :] == ["Workers: none recorded in the lock store."]


def test_status_as_json(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    assert app.current is not None
    app.current.dispatch(app.Touch())
    assert main(["queue:status", APP, "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report == [
        {
            "connection": "main",
            "driver": "memory",
            "queues": {"default": {"ready": 1, "delayed": 0, "reserved": 0, "total": 1, "paused": False}},
            "failed": 0,
            "workers": [],
        }
    ]


def test_failed_prints_a_readable_table(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    ids = fail_some(memory, 2)
    assert main(["queue:failed", APP]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "CONNECTION", "QUEUE", "JOB", "FAILED", "AT", "(UTC)", "TRIES", "ERROR"]
    assert len(lines) == 3
    for job_id, line in zip(sorted(ids), sorted(lines[1:]), strict=True):
        assert line.startswith(job_id)
        assert line.split()[1:4] == ["main", "mail", "cli-tests.broken"]
        assert line.endswith(f"1/1    RuntimeError: broken job {ids.index(job_id)}")


def test_failed_says_when_there_are_none_and_when_there_are_more(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["queue:failed", APP]) == EXIT_OK
    assert capsys.readouterr().out == "No failed jobs.\n"
    fail_some(memory, 3)
    assert main(["queue:failed", APP, "--limit=2"]) == EXIT_OK
    assert "Showing the newest 2 of 3 failed jobs" in capsys.readouterr().out


def test_failed_as_json(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    (job_id,) = fail_some(memory, 1)
    assert main(["queue:failed", APP, "--json"]) == EXIT_OK
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["id"] == job_id and entry["payload"] == {"n": 0} and "broken job 0" in entry["error"]


def test_retry_one_queues_it_again(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = fail_some(memory, 2)
    assert main(["queue:retry", first, APP]) == EXIT_OK
    assert f"Queued failed job {first} again on connection main" in capsys.readouterr().out
    assert [f.id for f in memory.failed_jobs()] == [second]
    assert memory.size("mail") == 1


def test_retry_all(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    fail_some(memory, 5)
    assert main(["queue:retry", "all", APP]) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.out == "Queued 5 failed job(s) again.\n"
    assert captured.err == ""  # no progress off a terminal
    assert memory.failed_jobs() == [] and memory.size("mail") == 5


def test_retry_an_unknown_id_fails_with_one_line(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:retry", "nope", APP]) == EXIT_FAILURE
    assert (
        capsys.readouterr().err
        == "rainier-sync: error: no failed job has id 'nope' (rainier-sync queue:failed lists them)\n"
    )


def test_forget(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    (job_id,) = fail_some(memory, 1)
    assert main(["queue:forget", job_id, APP]) == EXIT_OK
    assert f"Forgot failed job {job_id}" in capsys.readouterr().out
    assert memory.failed_jobs() == [] and memory.size() == 0
    assert main(["queue:forget", job_id, APP]) == EXIT_FAILURE


def test_reclaim_makes_lapsed_reservations_available(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    assert app.current is not None
    with freeze_time("2026-01-01 12:00:00") as frozen:
        app.current.dispatch(app.Touch())
        assert memory.reserve(["default"]) is not None
        assert main(["queue:reclaim", APP]) == EXIT_OK
        assert "main (memory): 0 lapsed reservation(s) reclaimed" in capsys.readouterr().out
        frozen.tick(31)
        assert main(["queue:reclaim", APP]) == EXIT_OK
        assert "main (memory): 1 lapsed reservation(s) reclaimed" in capsys.readouterr().out
    assert memory.counts("default").ready == 1


def test_migrate_says_which_connections_had_nothing_to_migrate(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["queue:migrate", APP]) == EXIT_OK
    assert capsys.readouterr().out == "main (memory): nothing to migrate\n"


def test_an_undeclared_connection_is_a_usage_error(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:status", APP, "--connection=bulk"]) == EXIT_USAGE
    assert capsys.readouterr().err == "rainier-sync: error: connection 'bulk' is not declared (declared: main)\n"


def test_work_once_runs_what_is_due(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, out_file: object
) -> None:
    monkeypatch.setenv("CLI_APP_OUT", str(out_file))
    assert app.current is not None
    for n in range(3):
        app.current.dispatch(app.Touch(n=n))
    assert main(["queue:work", "--once", "--concurrency=2", "--prefetch=0", APP]) == EXIT_OK
    assert sorted(open(str(out_file)).read().split("\n")[:-1]) == ["0 ran", "1 ran", "2 ran"]
    assert memory.size() == 0
    assert rainier_sync.instance() is app.current


def test_work_refuses_an_empty_registry(capsys: pytest.CaptureFixture[str]) -> None:
    from rainier_sync import QueueManager

    app.current = QueueManager(connections={"main": MemoryQueue()})
    assert main(["queue:work", "--once", APP]) == EXIT_USAGE
    assert "the job registry is empty" in capsys.readouterr().err


def test_work_refuses_a_sync_connection(capsys: pytest.CaptureFixture[str]) -> None:
    from rainier_sync import Container, QueueManager
    from rainier_sync.drivers import SyncQueue

    app.current = QueueManager(connections={"inline": SyncQueue()}, registry=app.registry, container=Container())
    assert main(["queue:work", APP]) == EXIT_USAGE
    assert "connection 'inline' is sync: it runs jobs inline" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("--concurrency=0", "argument --concurrency: expected a number >= 1, got 0"),
        ("--max-jobs=many", "argument --max-jobs: expected a whole number, got 'many'"),
        ("--sleep=-1", "argument --sleep: expected seconds >= 0, got -1"),
        ("--queue=,", "worker option queues must be non-empty queue names"),
        ("--timeout=0", "worker option timeout must be a positive number"),
        ("--prefetch=-2", "argument --prefetch: expected a number >= 0, got -2"),
    ],
)
def test_bad_worker_options_are_usage_errors(
    memory: MemoryQueue, option: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["queue:work", option, APP]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("rainier-sync: error: ") and says in err and err.count("\n") == 1


def test_boots_from_the_environment_without_an_app(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUEUE_DRIVER", "memory")
    assert main(["queue:status"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == ["memory", "memory", "(no", "jobs)"]


def test_rainier_app_names_the_app(
    memory: MemoryQueue, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAINIER_APP", "tests.cli.app:current_manager")
    assert main(["queue:migrate"]) == EXIT_OK
    assert "main (memory)" in capsys.readouterr().out


def test_app_before_the_command_works_too(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([APP, "queue:migrate"]) == EXIT_OK
    assert "main (memory)" in capsys.readouterr().out


def test_nothing_configured_says_how_to_configure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:status"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "rainier-sync: error: no queue is configured: pass --app module:attribute, set RAINIER_APP, "
        "or set QUEUE_DRIVER\n"
    )


def test_a_configuration_error_from_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUEUE_DRIVER", "redis")
    assert main(["queue:status"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "rainier-sync: error: QUEUE_DRIVER=redis: connection 'redis' (redis): REDIS_URL is required and not set "
        "(or give REDIS_SENTINELS and REDIS_SENTINEL_SERVICE)\n"
    )


@pytest.mark.parametrize(
    ("app_ref", "says"),
    [
        ("tests.cli.app", "--app 'tests.cli.app' must be module:attribute"),
        ("tests.cli.nowhere:manager", "--app tests.cli.nowhere:manager: no module named 'tests.cli.nowhere'"),
        ("tests.cli.app:nothing", "--app tests.cli.app:nothing: module 'tests.cli.app' has no attribute 'nothing'"),
        ("tests.cli.app:not_a_manager", "is of type int, not a QueueManager or a zero-argument factory"),
        ("tests.cli.app:Touch", "is the class Touch, not a QueueManager"),
        ("tests.cli.app:returns_wrong_type", "returned an object of type dict, not a QueueManager"),
        ("tests.cli.app:needs_an_argument", "calling the factory with no arguments failed"),
        ("tests.cli.broken_app:manager", "importing 'tests.cli.broken_app' failed: RuntimeError: the application's"),
    ],
)
def test_an_app_that_does_not_load_is_one_clear_line(
    app_ref: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["queue:status", f"--app={app_ref}"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("rainier-sync: error: ") and says in err and err.count("\n") == 1


def test_an_unexpected_error_is_one_line_and_v_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:status", "--app=tests.cli.app:explodes"]) == EXIT_FAILURE
    assert capsys.readouterr().err == (
        "rainier-sync: error: RuntimeError: could not reach the settings service (-v shows the traceback)\n"
    )
    assert main(["queue:status", "--app=tests.cli.app:explodes", "-v"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in explodes\n    raise RuntimeError" in err


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:wrok"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "rainier-sync: error: unknown command 'queue:wrok'; did you mean 'queue:work'? (see rainier-sync --help)\n"
    )
    assert main(["frobnicate"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("rainier-sync: error: unknown command 'frobnicate' (commands: queue:work, queue:failed,")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["queue:work", "--concurency=2"],
            "unrecognized option '--concurency'; did you mean '--concurrency'? (see rainier-sync queue:work --help)",
        ),
        (
            ["queue:failed", "--limt", "3"],
            "unrecognized option '--limt'; did you mean '--limit'? (see rainier-sync queue:failed --help)",
        ),
        (
            ["queue:status", "--conection=main"],
            "unrecognized option '--conection'; did you mean '--connection'? (see rainier-sync queue:status --help)",
        ),
        (["queue:status", "--frobnicate"], "unrecognized option '--frobnicate' (see rainier-sync queue:status --help)"),
        (["queue:reclaim", "now"], "unrecognized argument 'now' (see rainier-sync queue:reclaim --help)"),
    ],
)
def test_a_misspelt_option_gets_a_did_you_mean(
    memory: MemoryQueue, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, APP]) == EXIT_USAGE
    assert capsys.readouterr().err == f"rainier-sync: error: {says}\n"


# -- exit codes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["unreachable", "unreachable_compatible"])
@pytest.mark.parametrize("command", [["queue:status"], ["queue:failed"], ["queue:reclaim"], ["queue:retry", "all"]])
def test_a_backend_that_cannot_be_reached_exits_1(
    factory: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """QueueUnavailableError is an outage, not a configuration mistake: exit 1, also when
    the error class derives from ConfigurationError too."""
    assert main([*command, f"--app=tests.cli.app:{factory}"]) == EXIT_FAILURE
    assert capsys.readouterr().err == (
        "rainier-sync: error: connection 'main' (memory): could not reach the server at 127.0.0.1:1\n"
    )


# -- queue:failed: the exception record and one job in full --------------------------------------------


def fail_with_a_cause(driver: MemoryQueue, message: str = "broken job 7") -> str:
    manager = app.current
    assert manager is not None
    manager.dispatch_on("mail", app.Broken(n=7))
    reserved = driver.reserve(["mail"])
    assert reserved is not None
    try:
        try:
            raise KeyError("smtp.example")
        except KeyError as exc:
            raise RuntimeError(message) from exc
    except RuntimeError as exc:
        driver.fail(reserved, exc)
    return reserved.id


def test_failed_as_json_carries_the_exception_record(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    fail_with_a_cause(memory)
    assert main(["queue:failed", APP, "--json"]) == EXIT_OK
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["error"] == "RuntimeError: broken job 7"
    exception = entry["exception"]
    assert exception["kind"] == "RuntimeError" and exception["message"] == "broken job 7"
    assert exception["causes"] == [["KeyError", "'smtp.example'"]]
    assert "raise RuntimeError(message) from exc" in exception["traceback"]
    assert exception["timed_out"] is False and exception["crashed"] is False


def test_failed_id_shows_one_job_in_full(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    fail_some(memory, 1)
    with freeze_time("2026-03-01 12:04:09"):
        job_id = fail_with_a_cause(memory)
    assert main(["queue:failed", job_id, APP]) == EXIT_OK
    out = capsys.readouterr().out
    head, payload, trace = out.split("\n\n", 2)
    assert head.splitlines() == [
        f"ID          {job_id}",
        "Connection  main",
        "Queue       mail",
        "Job         cli-tests.broken",
        "Failed at   2026-03-01 12:04:09 UTC",
        "Tries       1/1",
        "Error       RuntimeError: broken job 7",
        "Caused by   KeyError: 'smtp.example'",
        "Timed out   no",
        "Crashed     no",
    ]
    assert payload == 'Payload:\n{\n  "n": 7\n}'
    assert trace.startswith("Traceback:\nTraceback (most recent call last):\n")
    assert "raise RuntimeError(message) from exc" in trace and trace.endswith("RuntimeError: broken job 7\n")


def test_failed_id_as_json_is_the_one_record(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    fail_some(memory, 2)
    job_id = fail_with_a_cause(memory)
    assert main(["queue:failed", job_id, "--json", APP]) == EXIT_OK
    entry = json.loads(capsys.readouterr().out)
    assert entry["id"] == job_id and entry["payload"] == {"n": 7} and entry["attempts"] == 1
    assert entry["exception"]["causes"] == [["KeyError", "'smtp.example'"]]
    assert "Traceback (most recent call last)" in entry["exception"]["traceback"]


def test_failed_an_unknown_id_is_one_line_and_exit_1(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    fail_some(memory, 1)
    assert main(["queue:failed", "nope", APP]) == EXIT_FAILURE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "rainier-sync: error: no failed job has id 'nope' (rainier-sync queue:failed lists them)\n"


def test_failed_list_cuts_long_errors_that_the_detail_shows_whole(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    long = "x" * 300 + "\nsecond line of the message"
    job_id = fail_with_a_cause(memory, long)
    assert main(["queue:failed", APP]) == EXIT_OK
    header, row = capsys.readouterr().out.splitlines()
    assert row.startswith(job_id) and row.endswith("RuntimeError: " + "x" * 83 + "...")
    assert main(["queue:failed", job_id, APP]) == EXIT_OK
    detail = capsys.readouterr().out
    assert f"Error       RuntimeError: {'x' * 300}\n            second line of the message\n" in detail


# -- queue:work --once --fail-on-failed --------------------------------------------------------------


def test_work_fail_on_failed_exits_1_when_a_job_failed_for_good(
    memory: MemoryQueue, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, out_file: object
) -> None:
    monkeypatch.setenv("CLI_APP_OUT", str(out_file))
    assert app.current is not None
    app.current.dispatch(app.Touch(n=0))
    app.current.dispatch(app.Broken(n=1))
    app.current.dispatch(app.Broken(n=2))
    with caplog.at_level(logging.INFO, logger="rainier_sync"):
        assert main(["queue:work", "--once", "--fail-on-failed", APP]) == EXIT_FAILURE
    (summary,) = [r for r in caplog.records if r.getMessage().startswith("worker stopped")]
    assert summary.levelno == logging.WARNING
    assert summary.getMessage() == (
        "worker stopped: 1 processed, 0 released, 2 failed; exit 1: 2 job(s) failed for good (--fail-on-failed)"
    )
    assert memory.failed_count() == 2


def test_work_fail_on_failed_exits_0_when_nothing_failed(
    memory: MemoryQueue, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, out_file: object
) -> None:
    monkeypatch.setenv("CLI_APP_OUT", str(out_file))
    assert app.current is not None
    fail_some(memory, 1)  # failed before this run: not this run's failure
    app.current.dispatch(app.Touch(n=0))
    with caplog.at_level(logging.INFO, logger="rainier_sync"):
        assert main(["queue:work", "--once", "--fail-on-failed", APP]) == EXIT_OK
    assert "worker stopped: 1 processed, 0 released, 0 failed" in caplog.messages


def test_fail_on_failed_needs_a_run_that_ends(memory: MemoryQueue, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:work", "--fail-on-failed", APP]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "rainier-sync: error: --fail-on-failed needs --once or --max-jobs: a worker that runs until stopped "
        "has no run to judge (see rainier-sync queue:work --help)\n"
    )


@dataclass
class OnlyOne(Job):
    NAME = "cli-tests.only-one"

    key: str = "k"

    def handle(self, context: JobContext) -> None:
        raise RuntimeError("fails")

    def unique_id(self) -> str:
        return self.key


def test_retry_takes_a_unique_jobs_lock_again_or_says_a_live_copy_holds_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    driver = MemoryQueue()
    manager = app.current = QueueManager(
        connections={"main": driver}, registry=JobRegistry().with_job(OnlyOne), locks=MemoryLockStore()
    )
    first = manager.dispatch(OnlyOne())
    Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    assert [f.id for f in driver.failed_jobs()] == [first]
    assert main(["queue:retry", str(first), APP]) == EXIT_OK
    assert manager.dispatch(OnlyOne()) is None, "after the retry, a fresh dispatch is a duplicate"
    assert driver.size() == 1
    # Fail it again, then queue a live copy: the retry must not make it two.
    Worker(manager, options=WorkerOptions(once=True, concurrency=1)).run()
    live = manager.dispatch(OnlyOne())
    assert live is not None
    capsys.readouterr()
    assert main(["queue:retry", str(first), APP]) == EXIT_FAILURE
    assert "is unique (cli-tests.only-one:k) and a copy of it is queued or running now" in capsys.readouterr().err
    assert main(["queue:retry", "all", APP]) == EXIT_OK
    assert "Queued 0 failed job(s) again (1 kept: a live copy holds their unique lock)" in capsys.readouterr().out
    assert [f.id for f in driver.failed_jobs()] == [first] and [j.id for j in driver.jobs] == [live]


def test_pause_and_continue_a_queue(capsys: pytest.CaptureFixture[str]) -> None:
    driver = MemoryQueue()
    manager = app.current = QueueManager(
        connections={"main": driver}, registry=app.registry, container=Container(), locks=MemoryLockStore()
    )
    assert main(["queue:pause", "mail", APP]) == EXIT_OK
    assert "Paused queue mail on connection main" in capsys.readouterr().out
    assert manager.paused("main") == {"mail"}
    assert main(["queue:status", APP]) == EXIT_OK
    assert "mail (paused)" in capsys.readouterr().out
    assert main(["queue:status", APP, "--json"]) == EXIT_OK
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["queues"]["mail"]["paused"] is True
    assert main(["queue:continue", "mail", APP]) == EXIT_OK
    assert manager.paused("main") == set()


def test_pausing_without_a_lock_store_is_one_line_naming_locks(capsys: pytest.CaptureFixture[str]) -> None:
    app.current = QueueManager(connections={"main": MemoryQueue()}, registry=app.registry, locks=None)
    assert main(["queue:pause", "mail", APP]) == EXIT_USAGE
    assert "pausing a queue needs a lock store" in capsys.readouterr().err
    assert main(["queue:status", APP]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == (
        "Workers: not recorded, the manager has no lock store (give QueueManager locks=)."
    )


def test_pausing_an_app_given_no_locks_keeps_the_flag_in_its_queues_backend(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["queue:pause", "mail", APP]) == EXIT_OK
    assert app.current is not None and app.current.paused() == {"mail"}
    assert main(["queue:status", APP, "--queue=mail"]) == EXIT_OK
    assert "mail (paused)" in capsys.readouterr().out
    assert main(["queue:continue", "mail", APP]) == EXIT_OK
    assert app.current.paused() == set()


def test_schedule_run_dispatches_each_due_tick_once_and_schedule_list_shows_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rainier_sync import Schedule

    driver = MemoryQueue()
    schedule = Schedule().every(60, app.Touch(n=1), name="minutely").cron("0 3 * * *", app.Touch(n=2), tz="Asia/Tokyo")
    manager = app.current = QueueManager(
        connections={"main": driver}, registry=app.registry, container=Container(), locks=MemoryLockStore(),
        schedule=schedule,
    )  # fmt: skip
    with freeze_time("2026-03-01 12:00:30"):
        assert main(["schedule:run", APP]) == EXIT_OK
        out = capsys.readouterr().out
        assert "dispatched minutely (tick 2026-03-01 12:00:00)" in out
        assert "dispatched cli-tests.touch (tick 2026-02-28 18:00:00)" in out, "03:00 in Tokyo is 18:00 UTC"
        assert "2 tick(s) dispatched" in out and driver.size() == 2
        assert main(["schedule:run", APP]) == EXIT_OK, "a second run from any host"
        assert "0 tick(s) dispatched" in capsys.readouterr().out and driver.size() == 2
        assert main(["schedule:list", APP]) == EXIT_OK
        listing = capsys.readouterr().out
    assert "minutely" in listing and "every 60s" in listing and "2026-03-01 12:01:00" in listing
    assert "2026-03-02 03:00:00 JST" in listing and "2026-03-01 18:00:00" in listing
    assert [j.id for j in driver.jobs][0] in listing, "the job that holds the last tick"
    assert manager.schedule is schedule


def test_schedule_run_without_a_schedule_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    app.current = QueueManager(
        connections={"main": MemoryQueue()}, registry=app.registry, container=Container(), locks=MemoryLockStore()
    )
    assert main(["schedule:run", APP]) == EXIT_USAGE
    assert "no schedule" in capsys.readouterr().err


def test_queue_work_schedule_dispatches_and_runs_the_due_ticks(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rainier_sync import Schedule

    out = tmp_path / "out.txt"
    monkeypatch.setenv("CLI_APP_OUT", str(out))
    app.current = QueueManager(
        connections={"main": MemoryQueue()}, registry=app.registry, container=Container(), locks=MemoryLockStore(),
        schedule=Schedule().every(3600, app.Touch(n=7)),
    )  # fmt: skip
    assert main(["queue:work", "--once", "--schedule", APP]) == EXIT_OK
    assert out.read_text().split() == ["7", "ran"]


def test_queue_work_grace_sets_the_workers_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real_run = Worker.run

    def run(self: Worker) -> Any:
        seen.append(self.options.grace)
        return real_run(self)

    monkeypatch.setattr(Worker, "run", run)
    app.current = QueueManager(connections={"main": MemoryQueue()}, registry=app.registry, container=Container())
    assert main(["queue:work", "--once", "--grace=7.5", APP]) == EXIT_OK
    assert seen == [7.5]
    assert main(["queue:work", "--once", "--grace=soon", APP]) == EXIT_USAGE


def test_status_lists_the_workers_recorded_in_the_lock_store(capsys: pytest.CaptureFixture[str]) -> None:
    manager = app.current = QueueManager(
        connections={"main": MemoryQueue()}, registry=app.registry, container=Container(), locks=MemoryLockStore()
    )
    assert main(["queue:status", APP]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "Workers: none recorded in the lock store."
    workers = [
        Worker(manager, options=WorkerOptions(queues=["default", "mail"], concurrency=4)),
        Worker(manager, options=WorkerOptions(queues=["mail"], concurrency=2)),
    ]
    with freeze_time("2026-01-01 12:00:00"):
        for worker in workers:
            assert worker.fleet is not None
            worker.fleet.refresh()  # recorded as a running worker records itself
    with freeze_time("2026-01-01 12:00:07"):
        assert main(["queue:status", APP]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("") + 1
    assert lines[start].split() == [
        "WORKER", "CONNECTION", "QUEUES", "THREADS", "RUNNING", "STARTED", "(UTC)", "SEEN", "VERSION"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[start + 1 :]}
    first = workers[0].fleet
    assert first is not None and len(rows) == 2
    assert rows[first.id][1:] == [
        "main", "default,mail", "4", "0", "2026-01-01", "12:00:00", "7s", "ago", rainier_sync.__version__
    ]  # fmt: skip
    with freeze_time("2026-01-01 12:00:07"):
        assert main(["queue:status", APP, "--json"]) == EXIT_OK
    (entry,) = json.loads(capsys.readouterr().out)
    recorded = {w["id"]: w for w in entry["workers"]}
    assert set(recorded) == {w.fleet.id for w in workers if w.fleet is not None}
    assert recorded[first.id]["queues"] == ["default", "mail"] and recorded[first.id]["concurrency"] == 4
    assert recorded[first.id]["running"] == [] and recorded[first.id]["last_heartbeat"] == 1767268800.0
    for worker in workers:
        assert worker.fleet is not None
        worker.fleet.leave()
    assert main(["queue:status", APP, "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)[0]["workers"] == []


def test_a_failed_jobs_stored_fields_are_escaped_in_the_table(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    from rainier_sync.types import QueuedJob

    memory.push(QueuedJob(id="id\nforged", name="name\nforged\x00row", queue="mail", payload={}))
    reserved = memory.reserve(["mail"])
    assert reserved is not None
    memory.fail(reserved, "RuntimeError: error\x1b[2J\x00")
    assert main(["queue:failed", APP]) == EXIT_OK
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2 and "\x00" not in out and "\x1b" not in out, out
    assert lines[1].startswith("id\\nforged") and "name\\nforged\\x00row" in lines[1]
    assert lines[1].endswith("RuntimeError: error\\x1b[2J\\x00")


def test_an_error_line_escapes_what_the_error_carried(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue:status", "--app=tests.cli.app:explodes_with_control_characters"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x00" not in err, err
    assert "a line\\x00" in err


def test_one_failed_job_in_full_escapes_each_line_of_its_stored_fields(
    memory: MemoryQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    from rainier_sync.types import QueuedJob

    memory.push(QueuedJob(id="shown-1", name="name\x1b[2J\x00", queue="mail", payload={"text": "a\x00b"}))
    reserved = memory.reserve(["mail"])
    assert reserved is not None
    memory.fail(reserved, "RuntimeError: first\nsecond\x00")
    assert main(["queue:failed", "shown-1", APP]) == EXIT_OK
    out = capsys.readouterr().out
    assert "\x00" not in out and "\x1b" not in out, out
    assert "name\\x1b[2J\\x00" in out and "second\\x00" in out and '"a\\u0000b"' in out
