#!/usr/bin/env python3
"""rainier_sync beside RQ, Dramatiq, Huey, Celery and Procrastinate, on one machine, in one run.

    .venv/bin/python benchmarks/peers/run.py [--peers rq,celery,...] [--workloads enqueue,bulk,drain,latency,limits]
        [--n 10000] [--repeat 3] [--probes 200] [--json results.json]

See README.rst beside this file for what each figure means. Every sample of a
workload is interleaved across the peers (rep 1: A B C, rep 2: B C A ...) and
the tables show medians. Every drain is recounted from the records its jobs
wrote (outside the library under test) after its workers stopped; a drain
that lost or doubled jobs is reported as such, never as a rate.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import limits  # noqa: E402
from adapters import PEERS, load  # noqa: E402
from adapters.base import RECORD_SIZE, Adapter, Settings, Workers  # noqa: E402

WORKLOADS = ("enqueue", "bulk", "drain", "latency", "limits")
WARM_JOBS = 5


class SampleTimeout(Exception):
    """A sample ran past ``--sample-timeout``."""


class SampleFailed(Exception):
    """A sample could not produce a figure (a worker died, a wait timed out)."""


@dataclass
class Recount:
    """What the records of one sample say: every index expected, exactly once?"""

    expected: int
    total: int
    lost: int
    doubled: int
    unexpected: int
    stamps: dict[int, float] = field(repr=False)

    @property
    def exact(self) -> bool:
        return self.total == self.expected and self.lost == 0 and self.doubled == 0 and self.unexpected == 0

    def describe(self) -> str:
        if self.exact:
            return f"exact ({self.total})"
        return (
            f"{self.total} records for {self.expected} jobs: {self.lost} lost, {self.doubled} run twice or more,"
            f" {self.unexpected} unknown"
        )


def recount(path: Path, expected: int) -> Recount:
    """Parse every record of ``path`` against the job indices ``0 .. expected-1``."""
    data = path.read_bytes() if path.exists() else b""
    lines = data.splitlines()
    indices: Counter[int] = Counter()
    stamps: dict[int, float] = {}
    for line in lines:
        index_text, stamp_text = line.split()
        index = int(index_text)
        indices[index] += 1
        stamps.setdefault(index, float(stamp_text))
    known = [i for i in indices if 0 <= i < expected]
    return Recount(
        expected=expected,
        total=len(lines),
        lost=expected - len(known),
        doubled=sum(1 for i in known if indices[i] > 1),
        unexpected=sum(1 for i in indices if not 0 <= i < expected),
        stamps=stamps,
    )


def records_in(path: Path) -> int:
    try:
        return path.stat().st_size // RECORD_SIZE
    except FileNotFoundError:
        return 0


def wait_for_records(path: Path, count: int, timeout: float, workers: Workers, log: Path, poll: float) -> bool:
    """Wait until ``path`` holds ``count`` records; False on timeout; SampleFailed when every worker exited."""
    deadline = time.monotonic() + timeout
    while records_in(path) < count:
        if len(workers.exited()) == len(workers.processes):
            raise SampleFailed(f"every worker exited ({workers.exited()}) before {count} jobs ran; {log_tail(log)}")
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "no worker log"
    return f"worker log {log}, last lines:\n    " + "\n    ".join(text[-lines:]) if text else "empty worker log"


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise SampleTimeout in the runner's thread if the block runs longer than ``seconds``."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise SampleTimeout(f"the sample ran past --sample-timeout {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Runner:
    """Runs the samples; owns the temporary directory, the record files and the worker logs."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.worker_env = dict(os.environ)
        self.worker_env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.redis: Any = None

    def flush_redis(self, adapter: Adapter) -> None:
        if adapter.backend != "redis":
            return
        if self.redis is None:
            import redis

            self.redis = redis.Redis.from_url(self.args.redis_url, socket_timeout=10)
        self.redis.flushdb()

    def fresh(self, adapter: Adapter, tag: str) -> tuple[Path, Path]:
        """Empty the peer's queue; a new record file and log for this sample."""
        self.flush_redis(adapter)
        adapter.reset()
        records = self.workdir / f"records-{tag}.txt"
        log = self.workdir / "logs" / f"{tag}.log"
        log.parent.mkdir(exist_ok=True)
        return records, log

    @contextlib.contextmanager
    def workers(self, adapter: Adapter, records: Path, log: Path) -> Iterator[Workers]:
        env = dict(self.worker_env, PEERS_RECORD_FILE=str(records))
        with open(log, "ab") as out:
            workers = adapter.start_worker(env, str(HERE), out)
            try:
                yield workers
            finally:
                adapter.stop_worker(workers)

    def enqueue(self, adapter: Adapter, rep: int) -> dict[str, Any]:
        self.fresh(adapter, f"{adapter.name}-enqueue-{rep}")
        return {"enqueue_jobs_s": self._enqueue_all(adapter)}

    def _enqueue_all(self, adapter: Adapter) -> float:
        started = time.perf_counter()
        for index in range(self.args.n):
            adapter.enqueue_one(index)
        return self.args.n / (time.perf_counter() - started)

    def bulk(self, adapter: Adapter, rep: int) -> dict[str, Any]:
        if adapter.batch_api is None:
            return {"bulk_jobs_s": None, "note": "no batch enqueue API"}
        self.fresh(adapter, f"{adapter.name}-bulk-{rep}")
        n, batch = self.args.n, self.args.batch
        started = time.perf_counter()
        for start in range(0, n, batch):
            adapter.enqueue_many(range(start, min(n, start + batch)))
        return {"bulk_jobs_s": n / (time.perf_counter() - started)}

    def drain(self, adapter: Adapter, rep: int) -> dict[str, Any]:
        """N jobs enqueued one at a time (timed: the enqueue figure), then the workers started and timed to empty."""
        n = self.args.n
        records, log = self.fresh(adapter, f"{adapter.name}-drain-{rep}")
        result: dict[str, Any] = {"enqueue_jobs_s": self._enqueue_all(adapter)}
        spawned = time.time()
        with self.workers(adapter, records, log) as workers:
            finished = wait_for_records(records, n, self.args.drain_timeout, workers, log, poll=0.005)
        counted = recount(records, n)
        result["recount"] = counted.describe()
        result["exact"] = counted.exact
        if not finished:
            result["timed_out"] = True
            raise SampleFailed(
                f"drain not done after --drain-timeout {self.args.drain_timeout:g}s: {counted.describe()}"
            )
        if not counted.exact:
            return result
        first, last = min(counted.stamps.values()), max(counted.stamps.values())
        result["drain_jobs_s"] = n / (last - spawned)
        result["startup_s"] = first - spawned
        result["steady_jobs_s"] = (n - 1) / (last - first) if last > first else None
        return result

    def latency(self, adapter: Adapter, rep: int) -> dict[str, Any]:
        """An idle worker in its own process; one probe at a time, dispatch -> start of the job's body."""
        probes = self.args.probes
        records, log = self.fresh(adapter, f"{adapter.name}-latency-{rep}")
        rng = random.Random(self.args.seed * 1000 + rep)
        sent: list[float] = []
        with self.workers(adapter, records, log) as workers:
            for index in range(WARM_JOBS):
                adapter.enqueue_one(index)
                timeout = self.args.startup_timeout if index == 0 else self.args.probe_timeout
                if not wait_for_records(records, index + 1, timeout, workers, log, poll=0.001):
                    raise SampleFailed(f"warm-up job {index} did not run within {timeout:g}s; {log_tail(log)}")
            for probe in range(probes):
                time.sleep(rng.uniform(0, self.args.gap_ms / 1000))
                sent.append(time.time())
                adapter.enqueue_one(WARM_JOBS + probe)
                if not wait_for_records(records, WARM_JOBS + probe + 1, self.args.probe_timeout, workers, log, 0.0005):
                    raise SampleFailed(
                        f"probe {probe} did not start within --probe-timeout {self.args.probe_timeout:g}s"
                    )
        counted = recount(records, WARM_JOBS + probes)
        result: dict[str, Any] = {"recount": counted.describe(), "exact": counted.exact}
        if not counted.exact:
            return result
        waits = sorted((counted.stamps[WARM_JOBS + probe] - sent[probe]) * 1000 for probe in range(probes))
        result["p50_ms"] = percentile(waits, 50)
        result["p99_ms"] = percentile(waits, 99)
        return result


def percentile(ordered: Sequence[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# --- PostgreSQL: a database of the run's own -------------------------------------------------


def with_database(dsn: str, database: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(dsn)._replace(path="/" + database))


def create_database(admin_dsn: str, database: str) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')


def drop_database(admin_dsn: str, database: str) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


# --- the report ------------------------------------------------------------------------------


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render(headers: list[str], rows: list[list[str]], style: str) -> str:
    """A table as markdown or as an RST simple table; columns of figures are right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    figures = [bool(rows) and all(is_figure(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: list[str], sep: str) -> str:
        return sep.join(c.rjust(w) if f else c.ljust(w) for c, w, f in zip(cells, widths, figures, strict=True))

    if style == "markdown":
        out = ["| " + line(headers, " | ") + " |"]
        out.append(
            "|" + "|".join("-" * (w + 1) + (":" if f else "-") for w, f in zip(widths, figures, strict=True)) + "|"
        )
        out += ["| " + line(r, " | ") + " |" for r in rows]
        return "\n".join(out)
    rule = "  ".join("=" * w for w in widths)
    return "\n".join([rule, line(headers, "  ").rstrip(), rule, *(line(r, "  ").rstrip() for r in rows), rule])


def is_figure(cell: str) -> bool:
    return cell in ("n/a", "-") or cell.replace(",", "").replace(".", "", 1).isdigit()


def values(samples: list[dict[str, Any]], key: str, workload: str | None = None) -> list[float | None]:
    """``key`` of every sample that did not fail (of ``workload`` only, when given)."""
    return [s.get(key) for s in samples if s.get("ok") and (workload is None or s["workload"] == workload)]


FIGURES = ("enqueue_jobs_s", "bulk_jobs_s", "drain_jobs_s", "startup_s", "steady_jobs_s", "p50_ms", "p99_ms")


def medians(peers: list[str], samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per peer: the median of each figure over the samples that did not fail, and what the drains recounted."""
    found: dict[str, dict[str, Any]] = {}
    for name in peers:
        mine = [s for s in samples if s["peer"] == name]
        got: dict[str, Any] = {
            key: median(values(mine, key, "bulk" if key == "bulk_jobs_s" else None)) for key in FIGURES
        }
        drains = [s for s in mine if s["workload"] == "drain"]
        exact = sum(1 for s in drains if s.get("exact"))
        bad = [f"rep {s['rep']}: {s['recount']}" for s in drains if "recount" in s and not s.get("exact")]
        failed = [s for s in mine if not s.get("ok")]
        check = f"{exact}/{len(drains)} exact" if drains else "-"
        if bad:
            check += "; " + "; ".join(bad)
        if failed:
            check += f"; {len(failed)} failed"
        got["drain_recount"] = check
        found[name] = got
    return found


def summarise(report: dict[str, Any], style: str) -> str:
    meta = report["meta"]
    lines = [
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}",
        f"command: {meta['command']}",
        f"load average (1, 5, 15 min) before: {meta['load_before']}, after: {meta['load_after']}",
        f"N={meta['n']} jobs, {meta['repeat']} interleaved repeats, medians; {meta['probes']} latency probes;"
        f" {meta['concurrency']} threads per threaded worker, {meta['processes']} rq processes",
        "versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
    ]
    rows = []
    for name, got in report["medians"].items():
        rows.append(
            [
                name,
                meta["backends"][name],
                meta["workers"][name],
                fmt_rate(got["enqueue_jobs_s"]),
                fmt_rate(got["bulk_jobs_s"]),
                fmt_rate(got["drain_jobs_s"]),
                fmt_s(got["startup_s"]),
                fmt_rate(got["steady_jobs_s"]),
                fmt_ms(got["p50_ms"]),
                fmt_ms(got["p99_ms"]),
                got["drain_recount"],
            ]
        )
    headers = [
        "peer",
        "backend",
        "workers",
        "enqueue jobs/s",
        "bulk jobs/s",
        "drain jobs/s",
        "start-up s",
        "steady jobs/s",
        "p50 ms",
        "p99 ms",
        "drain recount",
    ]
    lines.append(render(headers, rows, style))
    if report["limits"]:
        lines.append("")
        by_label: dict[str, list[float]] = {}
        units: dict[str, str] = {}
        for label, value, unit in report["limits"]:
            by_label.setdefault(label, []).append(value)
            units[label] = unit
        limit_rows = [
            [label, fmt_rate(statistics.median(vals)), units[label], ", ".join(fmt_rate(v) for v in vals)]
            for label, vals in by_label.items()
        ]
        lines.append(render(["machine limit", "median", "unit", "samples"], limit_rows, style))
    notes = [f"- {name}: skipped: {why}" for name, why in report["skipped"].items()]
    notes += [
        f"- {s['peer']} {s['workload']} rep {s['rep']}: failed: {s['error']}"
        for s in report["samples"]
        if not s.get("ok")
    ]
    notes += [f"- limits: {why}" for why in report["limits_skipped"]]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated, from: " + ", ".join(PEERS))
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, from: " + ", ".join(WORKLOADS)
    )
    parser.add_argument("--n", type=int, default=10_000, help="jobs per enqueue, bulk and drain sample")
    parser.add_argument("--repeat", type=int, default=3, help="samples per peer and workload, interleaved")
    parser.add_argument("--probes", type=int, default=200, help="latency probes per sample")
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the medians, every sample, the worker commands and the versions to this file",
    )
    parser.add_argument("--format", choices=("markdown", "rst"), default="markdown")
    parser.add_argument("--concurrency", type=int, default=8, help="threads of each threaded worker")
    parser.add_argument("--processes", type=int, default=2, help="rq worker processes (rq has no threads)")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per call of a batch enqueue API")
    parser.add_argument("--gap-ms", type=float, default=20, help="random pause U[0, gap] before each probe")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--startup-timeout", type=float, default=60, help="for a fresh worker's first job")
    parser.add_argument("--probe-timeout", type=float, default=15)
    parser.add_argument("--sample-timeout", type=float, default=900, help="any one sample, whatever it waits on")
    parser.add_argument("--limit-seconds", type=float, default=3, help="length of each loop of the limits workload")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="where the run's temporary directory goes (default: the system's)")
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/12", help="its database is flushed before each sample"
    )
    parser.add_argument("--pg-admin-dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg-database", default="rainier_peers", help="created for the run and dropped at its end")
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for name in args.peers:
        if name not in PEERS:
            parser.error(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    for workload in args.workloads:
        if workload not in WORKLOADS:
            parser.error(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    if args.n < 1 or args.repeat < 1 or args.probes < 1 or args.batch < 1:
        parser.error("--n, --repeat, --probes and --batch must be at least 1")
    return args


def distribution_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    load_before = [round(x, 2) for x in os.getloadavg()]
    workdir = Path(tempfile.mkdtemp(prefix="rainier-peers-", dir=args.workdir))
    pg_dsn = with_database(args.pg_admin_dsn, args.pg_database)
    os.environ.update(
        PEERS_REDIS_URL=args.redis_url,
        PEERS_PG_DSN=pg_dsn,
        PEERS_SQLITE_DIR=str(workdir),
        PEERS_CONCURRENCY=str(args.concurrency),
        PEERS_PROCESSES=str(args.processes),
    )
    settings = Settings.from_env()
    runner = Runner(args, workdir)
    adapters: dict[str, Adapter] = {}
    skipped: dict[str, str] = {}
    samples: list[dict[str, Any]] = []
    limit_values: list[tuple[str, float, str]] = []
    limits_skipped: list[str] = []
    needs_pg = "limits" in args.workloads or any(name in ("procrastinate", "rainier-postgres") for name in args.peers)
    database_made = False
    pg_error = ""
    failures = 0
    try:
        if needs_pg:
            try:
                create_database(args.pg_admin_dsn, args.pg_database)
                database_made = True
            except Exception as exc:  # noqa: BLE001 - any reason is reported, and the PostgreSQL peers skipped
                pg_error = f"cannot create database {args.pg_database}: {exc}"
        for name in args.peers:
            try:
                adapter_class = load(name)
            except ImportError as exc:
                skipped[name] = f"not importable: {exc}"
                continue
            if adapter_class.backend == "postgres" and not database_made:
                skipped[name] = pg_error
                continue
            adapter = adapter_class(settings)
            try:
                with time_limit(args.sample_timeout):
                    adapter.prepare()
            except Exception as exc:  # noqa: BLE001 - a peer that cannot start is reported, not fatal
                skipped[name] = f"set-up failed: {type(exc).__name__}: {exc}"
                continue
            adapters[name] = adapter
            print(
                f"{name}: ready ({adapter_class.library} {distribution_version(adapter_class.library)})",
                file=sys.stderr,
            )

        steps: dict[str, Callable[[Adapter, int], dict[str, Any]]] = {
            "bulk": runner.bulk,
            "drain": runner.drain,
            "latency": runner.latency,
        }
        if "drain" not in args.workloads:
            steps["enqueue"] = runner.enqueue  # otherwise the drain's timed enqueue is the figure
        order = [w for w in ("enqueue", "bulk", "drain", "latency") if w in args.workloads and w in steps]
        for rep in range(1, args.repeat + 1):
            if "limits" in args.workloads:
                found, why = run_limits(args, pg_dsn if database_made else None, workdir)
                limit_values += found
                limits_skipped += [w for w in why if w not in limits_skipped]
            # The order of the peers turns by one each repeat, so none is always first (or last) after a change of load.
            names = list(adapters)
            turn = (rep - 1) % max(1, len(names))
            for workload in order:
                for name in names[turn:] + names[:turn]:
                    adapter = adapters[name]
                    sample: dict[str, Any] = {"peer": name, "workload": workload, "rep": rep}
                    started = time.perf_counter()
                    try:
                        with time_limit(args.sample_timeout):
                            sample.update(steps[workload](adapter, rep))
                        sample["ok"] = True
                    except (SampleFailed, SampleTimeout) as exc:
                        sample.update(ok=False, error=str(exc))
                    except Exception as exc:  # noqa: BLE001 - one broken sample must not end the run
                        sample.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                        traceback.print_exc()
                    if "enqueue" not in args.workloads:
                        sample.pop("enqueue_jobs_s", None)
                    sample["seconds"] = round(time.perf_counter() - started, 3)
                    sample["load"] = [round(x, 2) for x in os.getloadavg()]
                    failures += not sample["ok"] or sample.get("exact") is False
                    samples.append(sample)
                    print(f"rep {rep} {workload:8} {name:16} {progress(sample)}", file=sys.stderr)
    finally:
        for adapter in adapters.values():
            with contextlib.suppress(Exception):
                adapter.close()
        if runner.redis is not None:
            with contextlib.suppress(Exception):
                runner.redis.flushdb()
        if database_made:
            try:
                drop_database(args.pg_admin_dsn, args.pg_database)
            except Exception as exc:  # noqa: BLE001 - said, not raised: the results are still worth printing
                print(f"could not drop database {args.pg_database}: {exc}", file=sys.stderr)
        if failures:
            print(f"worker logs and records kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    peers = list(adapters)
    report = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["benchmarks/peers/run.py", *(sys.argv[1:] if argv is None else argv)]),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "n": args.n,
            "repeat": args.repeat,
            "probes": args.probes,
            "batch": args.batch,
            "concurrency": args.concurrency,
            "processes": args.processes,
            "peers": peers,
            "backends": {name: adapters[name].backend for name in peers},
            "workers": {name: adapters[name].worker_description() for name in peers},
            "worker_commands": {name: adapters[name].worker_commands() for name in peers},
            "batch_apis": {name: adapters[name].batch_api for name in peers},
            "versions": {
                lib: distribution_version(lib)
                for lib in sorted({adapters[name].library for name in peers} | {"redis", "psycopg"})
            },
        },
        "medians": medians(peers, samples),
        "samples": samples,
        "limits": limit_values,
        "limits_skipped": limits_skipped,
        "skipped": skipped,
    }
    print(summarise(report, args.format))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


def progress(sample: dict[str, Any]) -> str:
    if not sample["ok"]:
        return "FAILED: " + sample["error"].splitlines()[0]
    shown = {
        k: (round(v, 1) if isinstance(v, float) else v)
        for k, v in sample.items()
        if k not in ("peer", "workload", "rep", "ok", "load")
    }
    return " ".join(f"{k}={v}" for k, v in shown.items())


def run_limits(
    args: argparse.Namespace, pg_dsn: str | None, workdir: Path
) -> tuple[list[tuple[str, float, str]], list[str]]:
    """One sample of every machine limit; the reasons of those that could not run."""
    probes: list[tuple[str, Callable[[], list[tuple[str, float, str]]]]] = [
        ("redis-benchmark", lambda: limits.redis_benchmark(args.redis_url)),
        ("redis-py INCR", lambda: limits.redis_incr(args.redis_url, args.limit_seconds)),
        ("sqlite3", lambda: limits.sqlite_insert_commit(str(workdir), args.limit_seconds)),
    ]
    if pg_dsn is not None:
        probes += [
            ("pgbench", lambda: limits.pgbench_select(pg_dsn, max(1, round(args.limit_seconds)))),
            ("psycopg", lambda: limits.psycopg_insert_commit(pg_dsn, args.limit_seconds)),
        ]
    found: list[tuple[str, float, str]] = []
    why: list[str] = [] if pg_dsn is not None else ["pgbench and psycopg: no database of the run's own"]
    for label, probe in probes:
        try:
            with time_limit(args.sample_timeout):
                found += probe()
        except limits.Unavailable as exc:
            why.append(f"{label}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a limit that fails is reported beside the others
            why.append(f"{label}: failed: {type(exc).__name__}: {exc}")
    for label, value, _ in found:
        print(f"limits {label}: {value:,.0f}", file=sys.stderr)
    return found, why


if __name__ == "__main__":
    sys.exit(main())
