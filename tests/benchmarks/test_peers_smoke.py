"""The peer benchmark's harness runs: rainier_sync's peers at tiny N, every drain recounted exact.

The other libraries are measured only when installed (``pip install -e '.[bench]'``);
a peer whose library is not importable is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ROOT / "benchmarks" / "peers" / "run.py"

sys.path.insert(0, str(RUNNER.parent))
from adapters.base import RECORD  # noqa: E402
from run import recount  # noqa: E402

pytestmark = pytest.mark.processes

#: Peer -> the module its library installs.
OTHER_PEERS = {
    "rq": "rq",
    "dramatiq": "dramatiq",
    "huey-redis": "huey",
    "huey-sqlite": "huey",
    "celery": "celery",
    "procrastinate": "procrastinate",
}


def own_redis_db(redis_url: str) -> str:
    """The runner flushes its Redis database before each sample: never the test suite's."""
    return urlsplit(redis_url)._replace(path="/10").geturl()


def run_peers(tmp_path: pathlib.Path, peers: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = tmp_path / "peers.json"
    command = [sys.executable, str(RUNNER), "--peers", peers, "--n", "20", "--repeat", "1", "--probes", "5"]
    command += ["--workloads", "enqueue,bulk,drain,latency", "--json", str(out), "--workdir", str(tmp_path), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    report["stdout"] = done.stdout
    return report


def assert_measured(report: dict[str, Any], peer: str, bulk: bool) -> None:
    samples = {s["workload"]: s for s in report["samples"] if s["peer"] == peer}
    assert set(samples) == {"bulk", "drain", "latency"}, samples
    assert all(s["ok"] for s in samples.values()), samples
    assert samples["drain"]["exact"] and samples["drain"]["recount"] == "exact (20)"
    assert samples["drain"]["drain_jobs_s"] > 0 and samples["drain"]["enqueue_jobs_s"] > 0
    assert samples["latency"]["exact"] and samples["latency"]["p99_ms"] >= samples["latency"]["p50_ms"] > 0
    assert (samples["bulk"]["bulk_jobs_s"] is not None) is bulk
    assert peer in report["stdout"]


def test_rainier_sqlite(tmp_path: pathlib.Path) -> None:
    report = run_peers(tmp_path, "rainier-sqlite")
    assert_measured(report, "rainier-sqlite", bulk=True)
    assert report["skipped"] == {}


@pytest.mark.redis
def test_rainier_redis(tmp_path: pathlib.Path, redis_url: str) -> None:
    report = run_peers(tmp_path, "rainier-redis", "--redis-url", own_redis_db(redis_url))
    assert_measured(report, "rainier-redis", bulk=True)


@pytest.mark.postgres
def test_rainier_postgres_in_a_database_of_its_own(tmp_path: pathlib.Path, postgres_url: str) -> None:
    import psycopg

    database = f"rainier_peers_{uuid.uuid4().hex[:8]}"
    report = run_peers(tmp_path, "rainier-postgres", "--pg-admin-dsn", postgres_url, "--pg-database", database)
    assert_measured(report, "rainier-postgres", bulk=True)
    with psycopg.connect(postgres_url) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchall()
    assert left == [], f"the runner left database {database} behind"


def test_a_peer_whose_library_is_missing_is_skipped_with_the_reason(tmp_path: pathlib.Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "huey.py").write_text("raise ImportError('huey is blocked for this test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")]))
    report = run_peers(tmp_path, "rainier-sqlite,huey-sqlite", env=env)
    assert report["skipped"] == {"huey-sqlite": "not importable: huey is blocked for this test"}
    assert "huey-sqlite: skipped: not importable: huey is blocked for this test" in report["stdout"]
    assert_measured(report, "rainier-sqlite", bulk=True)


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.parametrize("peer", sorted(OTHER_PEERS))
def test_other_peer_when_installed(tmp_path: pathlib.Path, peer: str, redis_url: str, postgres_url: str) -> None:
    if importlib.util.find_spec(OTHER_PEERS[peer]) is None:
        pytest.skip(f"{OTHER_PEERS[peer]} is not installed (pip install -e '.[bench]')")
    database = f"rainier_peers_{uuid.uuid4().hex[:8]}"
    servers = ["--redis-url", own_redis_db(redis_url), "--pg-admin-dsn", postgres_url, "--pg-database", database]
    report = run_peers(tmp_path, peer, *servers)
    assert_measured(report, peer, bulk=peer in ("rq", "procrastinate"))


def test_recount_names_lost_and_doubled_jobs(tmp_path: pathlib.Path) -> None:
    records = tmp_path / "records.txt"
    records.write_bytes(b"".join(RECORD % (index, 1.5) for index in (0, 1, 1, 3, 7)))
    counted = recount(records, 4)
    assert (counted.total, counted.lost, counted.doubled, counted.unexpected) == (5, 1, 1, 1)
    assert not counted.exact
    assert counted.describe() == "5 records for 4 jobs: 1 lost, 1 run twice or more, 1 unknown"
    records.write_bytes(b"".join(RECORD % (index, 1.5) for index in range(4)))
    assert recount(records, 4).exact


def test_a_drain_past_its_timeout_is_a_failure_not_a_rate(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "peers.json"
    command = [sys.executable, str(RUNNER), "--peers", "rainier-sqlite", "--workloads", "drain", "--n", "20"]
    command += ["--repeat", "1", "--drain-timeout", "0", "--json", str(out), "--workdir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    (sample,) = json.loads(out.read_text())["samples"]
    assert not sample["ok"] and sample["error"].startswith("drain not done after --drain-timeout 0s")
    assert "drain_jobs_s" not in sample
    assert "rainier-sqlite drain rep 1: failed: drain not done" in done.stdout


def test_workers_that_ignore_sigterm_are_killed_with_their_children(tmp_path: pathlib.Path) -> None:
    from adapters.base import Workers

    pids = tmp_path / "pids"
    stubborn = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n"
    )
    with open(tmp_path / "log", "wb") as log:
        workers = Workers([[sys.executable, "-c", stubborn]], dict(os.environ), str(tmp_path), log)
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        leader, child = (int(pid) for pid in pids.read_text().split())
        workers.stop(grace=0.5)
    assert workers.exited() == [-signal.SIGKILL]
    deadline = time.monotonic() + 30
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(child), "the worker's child outlived it"
    assert not pid_alive(leader)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, reaped by init soon, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sample_past_the_sample_timeout_is_stopped_and_reported(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "peers.json"
    # 50 probes, each after a pause of up to 100 ms (seeded: 2.6 s in all), cannot finish within 1 s.
    command = [sys.executable, str(RUNNER), "--peers", "rainier-sqlite", "--workloads", "latency", "--probes", "50"]
    command += ["--gap-ms", "100", "--repeat", "1", "--sample-timeout", "1", "--json", str(out)]
    command += ["--workdir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    (sample,) = json.loads(out.read_text())["samples"]
    assert not sample["ok"] and sample["error"] == "the sample ran past --sample-timeout 1s"
