"""Configuration and command-line benchmark: what booting and the CLI cost.

    .venv/bin/python tests/benchmarks/bench_config.py [--connections 50] [--runs 10] [--failed 20000]

- ``check``: ``Connections.from_dict`` on a section of ``--connections``
  connections (every driver but sync, every setting declared): per section.
- ``toml``: ``Connections.load`` of the same section as a TOML file.
- ``boot``: ``QueueManager.from_config`` of three memory connections.
- ``cli start``: wall time of ``python -m rainier_sync queue:status`` on the
  memory test app, against ``python -c pass`` and ``import rainier_sync``
  (median of ``--runs`` processes).
- ``retry all``: ``queue:retry all`` in this process over ``--failed`` failed
  jobs, on memory and on SQLite: jobs per second.

Each in-process figure is the best of three runs; the machine may be shared,
so the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rainier_sync import Connections, QueueManager  # noqa: E402
from rainier_sync.cli import main  # noqa: E402
from rainier_sync.drivers import MemoryQueue  # noqa: E402

SQS = "https://sqs.us-east-1.amazonaws.com/123456789012/q"


def section(count: int) -> dict[str, Any]:
    kinds: list[dict[str, Any]] = [
        {"driver": "memory", "reservation": 60},
        {"driver": "redis", "url": "redis://127.0.0.1:6379/1", "prefix": "p:", "reservation": 90,
         "connect_timeout_ms": 2000, "response_timeout_ms": 250, "reconnect": True, "reconnect_attempts": 3,
         "reconnect_max_backoff_ms": 1000},
        {"driver": "sqs", "queue_url": SQS, "queue_urls": {"mail": SQS + "-mail"}, "failed_queue_url": SQS + "-f",
         "region": "us-east-1", "endpoint": "http://127.0.0.1:5000", "visibility_timeout": 60, "wait_time": 10,
         "key": "k", "secret": "s"},
        {"driver": "kafka", "brokers": ["a:9092", "b:9092"], "group": "g", "topic_prefix": "t.", "lease": 90},
        {"driver": "database", "reservation": 120},
    ]  # fmt: skip
    return {"default": "c0", "connections": {f"c{i}": kinds[i % len(kinds)] for i in range(count)}}


def to_toml(data: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return str(v)

    out = ["[queues]", f'default = "{data["default"]}"']
    for name, declaration in data["connections"].items():
        out.append(f"\n[queues.connections.{name}]")
        out.extend(f"{key} = {value(v)}" for key, v in declaration.items())
    return "\n".join(out) + "\n"


def best_of(fn: Callable[[], None], times: int, repeat: int = 3) -> float:
    """Best seconds per call over ``repeat`` runs of ``times`` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(times):
            fn()
        best = min(best, (time.perf_counter() - start) / times)
    return best


def process_median(args: list[str], runs: int) -> float:
    samples = []
    env = {k: v for k, v in os.environ.items() if k not in ("QUEUE_DRIVER", "RAINIER_APP")}
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(args, cwd=ROOT, env=env, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def retry_all(failed: int, sqlite: str | None = None) -> float:
    """``queue:retry all`` over ``failed`` failed jobs on memory, or on SQLite at ``sqlite``."""
    from tests.cli import app

    driver: Any
    if sqlite is None:
        driver = MemoryQueue()
    else:
        from rainier_sync.drivers.database import DatabaseQueue

        driver = DatabaseQueue.from_url(f"sqlite:///{sqlite}")
        driver.migrate()
    manager = QueueManager(connections={"main": driver}, registry=app.registry)
    for n in range(failed):
        manager.dispatch_on("mail", app.Broken(n=n))
    for job in driver.reserve_many(["mail"], failed):
        driver.fail(job, "RuntimeError: broken")
    app.current = manager
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["queue:retry", "all", "--app=tests.cli.app:current_manager"]) == 0
    elapsed = time.perf_counter() - start
    assert driver.size("mail") == failed
    manager.close()
    return failed / elapsed


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--failed", type=int, default=20_000)
    opts = parser.parse_args()

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cpus")
    data = section(opts.connections)
    check = best_of(lambda: Connections.from_dict(data), 200)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "queues.toml"
        path.write_text(to_toml(data))
        toml = best_of(lambda: Connections.load(path), 200)
    boot_section = {"default": "a", "connections": {n: {"driver": "memory"} for n in ("a", "b", "c")}}
    boot = best_of(lambda: QueueManager.from_config(boot_section, environ={}), 2000)

    python = sys.executable
    bare = process_median([python, "-c", "pass"], opts.runs)
    imported = process_median([python, "-c", "import rainier_sync"], opts.runs)
    cli = process_median(
        [python, "-m", "rainier_sync", "queue:status", "--app=tests.cli.app:make_manager"], opts.runs
    )
    retried = retry_all(opts.failed)
    with tempfile.TemporaryDirectory() as folder:
        retried_sqlite = retry_all(opts.failed, str(pathlib.Path(folder) / "jobs.db"))

    print("| what | figure |")
    print("| --- | --- |")
    print(f"| check a section of {opts.connections} connections | {check * 1e3:.2f} ms ({check / opts.connections * 1e6:.1f} µs each) |")  # noqa: E501
    print(f"| load + check the same as TOML | {toml * 1e3:.2f} ms |")
    print(f"| boot 3 memory connections | {boot * 1e6:.0f} µs |")
    print(f"| `python -c pass` | {bare * 1e3:.0f} ms |")
    print(f"| `python -c 'import rainier_sync'` | {imported * 1e3:.0f} ms |")
    print(f"| `python -m rainier_sync queue:status --app=...` | {cli * 1e3:.0f} ms |")
    print(f"| `queue:retry all` over {opts.failed} failed jobs (memory) | {retried:,.0f} jobs/s |")
    print(f"| `queue:retry all` over {opts.failed} failed jobs (SQLite, WAL) | {retried_sqlite:,.0f} jobs/s |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main_bench()
