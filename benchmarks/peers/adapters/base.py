"""What every peer shares: the settings, the job body that records each run, the adapter interface.

Worker processes import this module too (through their library's job module),
so it needs the standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, ClassVar

#: One run as the job body writes it: the job's index and ``time.time()`` at the start of its body.
RECORD = b"%09d %17.6f\n"
RECORD_SIZE = len(RECORD % (0, 0.0))

_lock = threading.Lock()
_fd: int | None = None
_fd_pid: int | None = None


def record_run(index: int) -> None:
    """Append one record for job ``index`` to ``$PEERS_RECORD_FILE``.

    Outside every library under test: one ``O_APPEND`` write, atomic across
    threads and processes, so the runner can recount a drain exactly. The file
    is opened once per process (again after a fork: rq forks per job).
    """
    global _fd, _fd_pid
    started = time.time()
    pid = os.getpid()
    if _fd_pid != pid:
        with _lock:
            if _fd_pid != pid:
                _fd = os.open(os.environ["PEERS_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                _fd_pid = pid
    assert _fd is not None
    os.write(_fd, RECORD % (index, started))


@dataclass(frozen=True)
class Settings:
    """Where the servers are; read from the environment by the runner and by every worker."""

    redis_url: str
    pg_dsn: str
    sqlite_dir: str
    concurrency: int
    processes: int

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            redis_url=os.environ.get("PEERS_REDIS_URL", "redis://127.0.0.1:6379/12"),
            pg_dsn=os.environ.get("PEERS_PG_DSN", "postgresql://postgres@127.0.0.1:5432/rainier_peers"),
            sqlite_dir=os.environ.get("PEERS_SQLITE_DIR", "/tmp"),
            concurrency=int(os.environ.get("PEERS_CONCURRENCY", "8")),
            processes=int(os.environ.get("PEERS_PROCESSES", "2")),
        )


class Workers:
    """The worker processes of one sample, each in its own session so its children stop with it."""

    def __init__(self, commands: list[list[str]], env: dict[str, str], cwd: str, log: IO[bytes]) -> None:
        self.commands = commands
        self.processes: list[subprocess.Popen[bytes]] = []
        try:
            for command in commands:
                self.processes.append(
                    subprocess.Popen(
                        command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        except BaseException:
            self.stop(grace=0)
            raise

    def exited(self) -> list[int]:
        """Exit codes of the processes that have already ended."""
        return [code for code in (p.poll() for p in self.processes) if code is not None]

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each process group, wait up to ``grace`` seconds, then SIGKILL what is left.

        The runner's SIGALRM (its sample timeout) and SIGTERM wait until this returns, so
        neither can cut it short and leave a worker running.
        """
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGTERM})
        try:
            self._stop(grace)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _stop(self, grace: float) -> None:
        for process in self.processes:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes:
            # Also the group's stragglers (rq's work horses) after the leader exited.
            _signal_group(process, signal.SIGKILL)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"worker {process.pid} survived SIGKILL for 10 s", file=sys.stderr)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Adapter:
    """One library on one backend, started as its users start it.

    The runner does the timing and the recounting; an adapter only knows how
    to empty its queue, enqueue, and which command lines run its workers.
    """

    #: Peer name on the command line, e.g. ``huey-sqlite``.
    name: ClassVar[str]
    #: Distribution whose version the results report.
    library: ClassVar[str]
    #: ``redis``, ``postgres`` or ``sqlite``.
    backend: ClassVar[str]
    #: The module a worker imports: it defines the job, whose body calls :func:`record_run`.
    job_module: ClassVar[str]
    #: The batch enqueue API timed by the ``bulk`` workload, or ``None`` when the library has none.
    batch_api: ClassVar[str | None] = None

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def prepare(self) -> None:
        """Once per run, before any sample: create schemas or files."""

    def reset(self) -> None:
        """Before each sample, with no worker running: leave the queue empty."""

    def worker_commands(self) -> list[list[str]]:
        """The command line of each worker process."""
        raise NotImplementedError

    def worker_description(self) -> str:
        return f"1 proc x {self.settings.concurrency} thr"

    def start_worker(self, env: dict[str, str], cwd: str, log: IO[bytes]) -> Workers:
        return Workers(self.worker_commands(), env, cwd, log)

    def stop_worker(self, workers: Workers) -> None:
        workers.stop()

    def enqueue_one(self, index: int) -> None:
        raise NotImplementedError

    def enqueue_many(self, indices: Sequence[int]) -> None:
        """One call of the library's batch API (only when :attr:`batch_api` is set)."""
        raise NotImplementedError

    def close(self) -> None:
        """After the run: close connections."""


def script(name: str, *args: str) -> list[str]:
    """A library's own console script (``rq``, ``celery``...) from the runner's environment."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.path.exists(here) else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"the worker command {name!r} is not installed beside {sys.executable}")
    return [found, *args]
