"""The argument parser: every command, its options and their types."""

from __future__ import annotations

import argparse
import difflib
from typing import IO, Any, Callable, NoReturn

from .. import __version__
from .app import Frontend, UsageError
from .check import cmd_check
from .commands import (
    cmd_continue,
    cmd_dashboard,
    cmd_failed,
    cmd_forget,
    cmd_health,
    cmd_make_job,
    cmd_migrate,
    cmd_pause,
    cmd_reclaim,
    cmd_retry,
    cmd_schedule_list,
    cmd_schedule_run,
    cmd_status,
    cmd_work,
)
from .outbox import cmd_outbox_forget, cmd_outbox_refused, cmd_outbox_relay, cmd_outbox_retry

__all__ = ["Parser", "build_parser", "unrecognized", "COMMANDS"]


class Parser(argparse.ArgumentParser):
    #: The parser of each command, by name (on the top-level parser).
    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.dest == "command" and action.choices is not None and value not in action.choices:
            names = list(action.choices)
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (commands: {', '.join(names)})"
            raise argparse.ArgumentError(None, f"unknown command {value!r}{hint}")
        super()._check_value(action, value)


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> UsageError:
    """The first argument ``parser`` did not take, with the option it most likely meant."""
    first = extras[0]
    if not first.startswith("-") or first == "-":
        return UsageError(f"unrecognized argument {first!r} (see {parser.prog} --help)")
    option = first.split("=", 1)[0]
    known = [name for action in parser._actions for name in action.option_strings]
    close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UsageError(f"unrecognized option {option!r}{hint} (see {parser.prog} --help)")



COMMANDS: dict[str, Callable[[Frontend, argparse.Namespace, IO[str]], int]] = {
    "queue:work": cmd_work,
    "queue:failed": cmd_failed,
    "queue:retry": cmd_retry,
    "queue:forget": cmd_forget,
    "queue:reclaim": cmd_reclaim,
    "queue:status": cmd_status,
    "queue:health": cmd_health,
    "queue:migrate": cmd_migrate,
    "outbox:relay": cmd_outbox_relay,
    "outbox:refused": cmd_outbox_refused,
    "outbox:retry": cmd_outbox_retry,
    "outbox:forget": cmd_outbox_forget,
    "queue:pause": cmd_pause,
    "queue:continue": cmd_continue,
    "schedule:run": cmd_schedule_run,
    "schedule:list": cmd_schedule_list,
    "make:job": cmd_make_job,
    "check": cmd_check,
    "dashboard": cmd_dashboard,
}


def int_from(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


positive_int = int_from(1)
whole = int_from(0)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def build_parser(frontend: Frontend | None = None) -> Parser:
    """The argument parser of every command, named as ``frontend`` (default: ``rainier-sync``) names them."""
    frontend = frontend or Frontend()
    app_help = "module:attribute of a QueueManager, or of a factory returning one (default: $RAINIER_APP)"
    # Accepted before and after the command; SUPPRESS keeps a subcommand from resetting what came before it.
    common = Parser(add_help=False)
    if frontend.takes_app:
        common.add_argument("--app", metavar="MODULE:ATTR", default=argparse.SUPPRESS, help=app_help)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = Parser(
        prog=frontend.name,
        description="Run and manage rainier_sync job queues.",
        epilog="Exit codes: 0 done, 1 an operation failed (or a backend cannot be reached), "
        "2 bad usage or configuration, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"rainier-sync {__version__}")
    if frontend.takes_app:
        parser.add_argument("--app", metavar="MODULE:ATTR", help=app_help)
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.commands = {}

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, parents=[common], prog=frontend.command(name))
        parser.commands[name] = sub
        return sub

    def connection_option(sub: argparse.ArgumentParser, what: str) -> None:
        sub.add_argument("--connection", metavar="NAME", help=f"only this connection (default: {what})")

    work = command("queue:work", "Run jobs until stopped (SIGTERM/SIGINT stop it gracefully).")
    work.add_argument("--queue", metavar="A,B", help="queues in priority order (default: default)")
    work.add_argument("--once", action="store_true", help="run what is due, then exit")
    work.add_argument(
        "--schedule", action="store_true", help="also dispatch the schedule's periodic jobs as they fall due"
    )
    work.add_argument(
        "--fail-on-failed",
        action="store_true",
        help="with --once or --max-jobs: exit 1 when a job of this run failed for good",
    )
    work.add_argument(
        "--give-up",
        type=seconds,
        metavar="SECONDS",
        help="with --once: exit 1 once the backend has kept failing this long (default: 30)",
    )
    work.add_argument(
        "--grace",
        type=seconds,
        metavar="SECONDS",
        help="after SIGTERM/SIGINT, how long running jobs get to finish (default: 30)",
    )
    work.add_argument("--max-jobs", type=positive_int, metavar="N", help="exit after taking N jobs")
    work.add_argument("--sleep", type=seconds, metavar="SECONDS", help="longest idle wait (default: 1)")
    work.add_argument("--concurrency", type=positive_int, metavar="N", help="threads running jobs (default: 8)")
    work.add_argument(
        "--prefetch",
        type=whole,
        metavar="N",
        help="most jobs claimed ahead of the threads when jobs are short (default: 8 per thread; 0: none)",
    )
    work.add_argument("--timeout", type=seconds, metavar="SECONDS", help="time limit of a job with no TIMEOUT")
    work.add_argument("--connection", metavar="NAME", help="the connection to work (default: the default one)")
    work.add_argument(
        "--child-setup",
        metavar="MODULE:FUNCTION",
        help="called in each new timeout child before its first attempt (see the timeouts docs)",
    )
    work.add_argument(
        "--health-file",
        metavar="PATH",
        help="touch PATH about once a second while the worker's loop turns (see queue:health)",
    )
    work.add_argument(
        "--relay", action="store_true", help="also relay the outbox's jobs to their connections (see outbox:relay)"
    )
    work.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")

    failed = command("queue:failed", "List failed jobs, newest first; with an ID, show that one in full.")
    failed.add_argument("id", nargs="?", metavar="ID", help="a failed job's id: show it whole, traceback included")
    failed.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N (default: 50)")
    connection_option(failed, "all")
    failed.add_argument("--json", action="store_true", help="print JSON (with the exception record) instead")

    retry = command("queue:retry", "Queue a failed job again, or all of them.")
    retry.add_argument("id", metavar="ID|all", help="a failed job's id, or 'all'")
    connection_option(retry, "all")

    forget = command("queue:forget", "Delete a failed job.")
    forget.add_argument("id", metavar="ID", help="the failed job's id")
    connection_option(forget, "all")

    reclaim = command("queue:reclaim", "Make jobs whose reservation lapsed available again.")
    connection_option(reclaim, "all")

    status = command("queue:status", "Jobs per queue and connection: ready, delayed, reserved, failed.")
    status.add_argument("--queue", metavar="A,B", help="always list these queues")
    connection_option(status, "all")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    health = command(
        "queue:health",
        "A liveness probe: exit 0 while a worker's --health-file is fresh, 1 when it is older or missing.",
    )
    health.add_argument(
        "--health-file", required=True, metavar="PATH", help="the file queue:work --health-file touches"
    )
    health.add_argument(
        "--max-age",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="oldest touch that still counts as alive (default: 60)",
    )

    for name, summary in (
        ("queue:pause", "Stop every worker of a connection from claiming jobs of a queue."),
        ("queue:continue", "Let workers claim jobs of a paused queue again."),
    ):
        sub = command(name, summary)
        sub.add_argument("queue", metavar="QUEUE", help="the queue's name")
        sub.add_argument("--connection", metavar="NAME", help="its connection (default: the default one)")

    run = command("schedule:run", "Dispatch the schedule's ticks that fell due since the last run, then exit.")
    run.add_argument("--connection", metavar="NAME", help="dispatch on this connection (default: the default one)")
    command("schedule:list", "The schedule's entries, their next run and the tick last dispatched.")

    command(
        "check",
        "Pre-flight: load the app and check its configuration, registry, schedule, lock store and connections; "
        "exit 0 when all is well, 2 when anything is not.",
    )

    migrate = command(
        "queue:migrate", "Create or update the queue's tables on every connection that has them, and the outbox's."
    )
    connection_option(migrate, "all, and the outbox")

    relay = command(
        "outbox:relay",
        "Publish the jobs committed to the outbox to their connections, in order, and delete them, until stopped "
        "(SIGTERM/SIGINT stop it once its batch is published).",
    )
    relay.add_argument("--once", action="store_true", help="relay what is committed now, then exit")
    relay.add_argument(
        "--sleep",
        type=positive_seconds,
        metavar="SECONDS",
        help="longest wait between looks where it cannot listen for commits (default: 1)",
    )
    relay.add_argument(
        "--batch", type=positive_int, metavar="N", help="rows published and deleted at a time (default: 500)"
    )
    relay.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")

    refused = command(
        "outbox:refused", "The outbox's rows set aside because their connection refused their job, oldest first."
    )
    refused.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N (default: 50)")
    refused.add_argument("--json", action="store_true", help="print JSON (with each job's envelope) instead")
    retry_rows = command("outbox:retry", "Put a row set aside (ROW) or all of them back in line for the relay.")
    retry_rows.add_argument("row", metavar="ROW|all", help="a row's number (see outbox:refused), or 'all'")
    forget_row = command("outbox:forget", "Delete a row set aside: its job is given up.")
    forget_row.add_argument("row", metavar="ROW", help="the row's number (see outbox:refused)")

    dashboard = command(
        "dashboard",
        "Serve the queue dashboard (the Flask extension's pages) with the standard library's server, "
        "until SIGTERM/SIGINT; visitors log in with $RAINIER_DASHBOARD_TOKEN.",
    )
    dashboard.add_argument(
        "--bind", default="127.0.0.1:8000", metavar="HOST:PORT", help="where to listen (default: 127.0.0.1:8000)"
    )
    dashboard.add_argument(
        "--no-auth",
        action="store_true",
        help="no login: refused unless --bind is a loopback address (requests must name a loopback host)",
    )

    make = command("make:job", "Write a job module and its test.")
    make.add_argument("name", metavar="Name", help="the job class, e.g. SendInvoice")
    make.add_argument("--path", default="jobs", help="package directory for the module (default: jobs)")
    make.add_argument("--tests", default="tests", help="directory for the test (default: tests)")
    make.add_argument("--queue", default="default", help="the job's QUEUE (default: default)")
    make.add_argument("--prefix", default="app", help="domain prefix of the wire NAME (default: app)")
    return parser


