from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_script_app_example_runs() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "script_app.py")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "thumbnails: uploads/cat.png, uploads/dog.png, uploads/flaky.png, uploads/owl.png"
    assert lines[1].startswith("retried: uploads/flaky.png (ConnectionError: image service timed out)")
    assert lines[2] == "processed 4, released 1, failed 0"


def test_the_rate_limited_example_runs_every_job_once_within_the_limit() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rate_limited.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "fetched: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"
    assert lines[1].startswith("busiest second: ") and lines[1].endswith(" call(s) (the API allows 5)")
    assert int(lines[1].split()[2]) <= 5
    deferred = int(lines[2].split()[1])
    assert deferred > 0 and lines[2].endswith("time(s): rate limit 'profile-api': 5 per 1.2s")
    assert lines[3] == f"processed 12, deferred {deferred}, failed 0"


def test_the_scheduled_example_runs_each_tick_once_across_two_schedulers() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "scheduled.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "12:00:05 host A dispatched minutely (tick 12:00:00)",
        "12:00:05 host A dispatched hourly (tick 12:00:00)",
        "12:01:05 host B dispatched minutely (tick 12:01:00)",
        "12:02:05 host A dispatched minutely (tick 12:02:00)",
        "ran: hourly 12:00:00, minutely 12:00:00, minutely 12:01:00, minutely 12:02:00",
        "processed 4, skipped 0",
        "12:00:05 host A dispatched minutely (tick 12:00:00), then: the scheduler died here",
        "12:00:06 host B found minutely (tick 12:00:00) free and dispatched it",
        "12:00:06 host B found hourly (tick 12:00:00) free and dispatched it",
        "queued: 3 jobs (two copies of the minutely tick)",
        "ran: hourly 12:00:00, minutely 12:00:00",
        "skipped a copy: schedule:minutely:2026-03-01T12:00:00+00:00 is held by the copy that ran",
        "processed 2, skipped 1",
    ]


def test_the_import_rows_example_counts_its_batch_and_runs_the_summary_once() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "import_rows.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "\r" not in done.stdout, "not a terminal: progress lines, not a line rewritten in place"
    progress = r"\[[#.]{30}\] (\d+)/200 rows, (\d) failed"
    assert [line.split(":")[0] for line in lines[:4]] == ["reached 25%", "reached 50%", "reached 75%", "reached 100%"]
    seen = [re.fullmatch(rf"reached \d+%: {progress}", line) for line in lines[:4]]
    assert all(seen), lines[:4]
    counts = [int(match.group(1)) for match in seen if match]
    assert counts == sorted(counts) and counts[0] >= 50 and counts[-1] == 200
    assert lines[3] == "reached 100%: [" + "#" * 30 + "] 200/200 rows, 4 failed"
    assert lines[4:] == [
        "batch customers.csv: total 200, processed 196, failed 4, skipped 0, cancelled no",
        "customers.csv: 196 rows imported",
        "customers.csv: rows not imported: 37, 88, 141, 190",
    ]


def test_the_workflow_example_runs_a_chain_stops_one_and_reads_results() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "workflow.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "chain for invoice 7 dispatched (id of 32 hex digits)",
        "invoice 7: fetched 2 lines",
        "invoice 7: rendered invoice-7.pdf",
        "invoice 7: mailed invoice-7.pdf to ada@example.com",
        "invoice 8: fetched 2 lines",
        "invoice 8: render attempt 1/2 failed",
        "invoice 8: render attempt 2/2 failed",
        "invoice 8: chain stopped; accounts told to send it by hand",
        "quote for cart 42, right after dispatch: pending",
        "quote for cart 42, waited for: processed {'total_cents': 1299}",
        "quote for cart 99, waited for: failed (KeyError: 'no cart 99')",
        "a job nobody dispatched: unknown",
        "processed 6, released 1, failed 2",
    ]
    assert "could not queue" not in done.stderr
