"""The machine's own limits, measured in the same run as the peers: how close each library gets.

Each probe returns ``(label, value, unit)`` or raises :class:`Unavailable`
when its tool is not installed.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
import sqlite3
import subprocess
import time
import urllib.parse
from collections.abc import Callable

Probe = Callable[[], list[tuple[str, float, str]]]


class Unavailable(Exception):
    """The probe's tool or client library is not installed."""


def _run(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def redis_benchmark(url: str, requests: int = 100_000) -> list[tuple[str, float, str]]:
    """``redis-benchmark -t set,incr`` (50 clients) without pipelining and with 16 commands per round trip."""
    tool = shutil.which("redis-benchmark")
    if tool is None:
        raise Unavailable("redis-benchmark is not installed (Debian: redis-tools)")
    parts = urllib.parse.urlsplit(url)
    db = (parts.path or "/0").lstrip("/") or "0"
    found = []
    for pipeline in (1, 16):
        out = _run(
            [
                tool,
                "-h",
                parts.hostname or "127.0.0.1",
                "-p",
                str(parts.port or 6379),
                "--dbnum",
                db,
                "-n",
                str(requests),
                "-t",
                "set,incr",
                "-P",
                str(pipeline),
                "--csv",
            ],
            timeout=120,
        )
        for row in csv.DictReader(io.StringIO(out)):
            label = f"redis-benchmark {row['test']}, 50 clients, " + ("no pipelining" if pipeline == 1 else "-P 16")
            found.append((label, float(row["rps"]), "ops/s"))
    return found


def pgbench_select(dsn: str, seconds: int = 5) -> list[tuple[str, float, str]]:
    """``pgbench -S`` (one-row SELECTs by primary key), 2 clients, after ``pgbench -i`` in the run's own database."""
    tool = shutil.which("pgbench")
    if tool is None:
        raise Unavailable("pgbench is not installed (Debian: postgresql-client)")
    parts = urllib.parse.urlsplit(dsn)
    where = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432), "-U", parts.username or "postgres"]
    database = parts.path.lstrip("/")
    _run([tool, "-i", "-q", *where, database], timeout=120)
    out = _run([tool, "-S", "-n", "-c", "2", "-j", "2", "-T", str(seconds), *where, database], timeout=seconds + 60)
    match = re.search(r"tps = ([0-9.]+)", out)
    if match is None:
        raise RuntimeError(f"no tps in pgbench's output: {out[-500:]}")
    return [(f"pgbench -S -c 2 -j 2 -T {seconds}", float(match.group(1)), "tx/s")]


def _loop(seconds: float, step: Callable[[], None]) -> float:
    """Calls of ``step`` per second over about ``seconds``."""
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        for _ in range(100):
            step()
        done += 100
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - started)


def psycopg_insert_commit(dsn: str, seconds: float = 3.0) -> list[tuple[str, float, str]]:
    """One thread of psycopg: INSERT one row, COMMIT, again (what one durable enqueue at least costs)."""
    try:
        import psycopg
    except ImportError as exc:
        raise Unavailable(f"psycopg is not installed: {exc}") from exc
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS peers_raw (id bigserial PRIMARY KEY, payload text NOT NULL)")
        conn.commit()

        def step() -> None:
            conn.execute("INSERT INTO peers_raw (payload) VALUES ('{}')")
            conn.commit()

        rate = _loop(seconds, step)
        conn.execute("DROP TABLE peers_raw")
        conn.commit()
    return [("psycopg INSERT + COMMIT, 1 thread", rate, "tx/s")]


def sqlite_insert_commit(directory: str, seconds: float = 3.0) -> list[tuple[str, float, str]]:
    """One thread of sqlite3: INSERT one row, COMMIT (WAL, ``synchronous=NORMAL``, the database driver's default)."""
    path = os.path.join(directory, "raw.db")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")

        def step() -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO raw (payload) VALUES ('{}')")
            conn.execute("COMMIT")

        rate = _loop(seconds, step)
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)
    return [("sqlite3 INSERT + COMMIT (WAL, synchronous=NORMAL), 1 thread", rate, "tx/s")]


def redis_incr(url: str, seconds: float = 3.0) -> list[tuple[str, float, str]]:
    """One thread of redis-py: INCR, wait for the reply, again (one round trip per call)."""
    try:
        import redis
    except ImportError as exc:
        raise Unavailable(f"redis-py is not installed: {exc}") from exc
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        rate = _loop(seconds, lambda: client.incr("peers:raw"))
        client.delete("peers:raw")
    finally:
        client.close()
    return [("redis-py INCR, 1 thread", rate, "ops/s")]
