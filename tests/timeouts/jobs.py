"""Jobs for the timeout tests. They run in child processes, so they report to
the test through files (a path in the payload), never through memory."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rainier_sync import Container, Job, JobContext, QueueManager
from rainier_sync import job as job_function


def note(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")


def notes(path: str | Path) -> list[str]:
    p = Path(path)
    return p.read_text(encoding="utf-8").splitlines() if p.exists() else []


@dataclass
class Noop(Job):
    """Records which process ran it."""

    NAME = "timeouts.noop"
    TIMEOUT = 10

    log: str = ""

    def handle(self, context: JobContext) -> None:
        if self.log:
            note(self.log, str(os.getpid()))


@dataclass
class Untimed(Job):
    NAME = "timeouts.untimed"

    log: str = ""

    def handle(self, context: JobContext) -> None:
        note(self.log, str(os.getpid()))


@dataclass
class Sleeper(Job):
    NAME = "timeouts.sleeper"
    TIMEOUT = 0.5
    TRIES = 2

    log: str = ""

    failed_calls: ClassVar[list[tuple[int, str]]] = []

    def handle(self, context: JobContext) -> None:
        note(self.log, f"start {os.getpid()}")
        time.sleep(30)
        note(self.log, "woke")  # never: the child is killed first

    def backoff(self, attempt: int) -> float:
        return 0

    def failed(self, context: JobContext, error: BaseException) -> None:
        # runs in the worker's own process, after the last attempt
        Sleeper.failed_calls.append((os.getpid(), type(error).__name__))


@dataclass
class Spinner(Job):
    NAME = "timeouts.spinner"
    TIMEOUT = 0.5

    def handle(self, context: JobContext) -> None:
        while True:
            pass


@dataclass
class BlockedRead(Job):
    """Blocks in C: a socket read with no timeout that nothing will ever answer."""

    NAME = "timeouts.blocked-read"
    TIMEOUT = 0.5

    def handle(self, context: JobContext) -> None:
        a, b = socket.socketpair()
        a.recv(1)


@dataclass
class Stubborn(Job):
    """Ignores SIGTERM, so only SIGKILL ends it."""

    NAME = "timeouts.stubborn"
    TIMEOUT = 1.0  # room to ignore SIGTERM before it comes, even on a loaded machine

    def handle(self, context: JobContext) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)


@dataclass
class Exits(Job):
    NAME = "timeouts.exits"
    TIMEOUT = 10

    def handle(self, context: JobContext) -> None:
        os._exit(3)


@dataclass
class Segfaults(Job):
    NAME = "timeouts.segfaults"
    TIMEOUT = 10

    def handle(self, context: JobContext) -> None:
        import faulthandler

        faulthandler.disable()  # keep the test output clean; the crash is the point
        ctypes.string_at(0)


@dataclass
class WaitsToBeKilled(Job):
    """Writes its pid, then waits for the test to kill it by hand."""

    NAME = "timeouts.waits-to-be-killed"
    TIMEOUT = 20

    log: str = ""

    def handle(self, context: JobContext) -> None:
        note(self.log, str(os.getpid()))
        time.sleep(20)


class LedgerError(Exception):
    pass


@dataclass
class Raises(Job):
    NAME = "timeouts.raises"
    TIMEOUT: ClassVar[float | None] = 10

    def handle(self, context: JobContext) -> None:
        try:
            try:
                raise ConnectionResetError("peer went away")
            except ConnectionResetError as exc:
                raise KeyError("account 42") from exc
        except KeyError as exc:
            raise LedgerError("could not post entry 7") from exc


@dataclass
class RaisesInThread(Raises):
    NAME = "timeouts.raises-in-thread"
    TIMEOUT = None


@dataclass
class Cooperative(Job):
    """Waits for ``stop_requested`` and records when it came."""

    NAME = "timeouts.cooperative"
    TIMEOUT = 3.0  # told at 2.7 s: 0.3 s to finish before the limit, even on a loaded machine

    log: str = ""

    def handle(self, context: JobContext) -> None:
        started = time.monotonic()
        note(self.log + ".started", "started")
        seen = context.stop_requested.wait(10)
        note(self.log, f"{seen} {time.monotonic() - started:.3f} {os.getpid()}")


@dataclass
class Slow(Job):
    """Runs past any grace the test gives, ignoring stop_requested."""

    NAME = "timeouts.slow"
    TIMEOUT = 30

    log: str = ""

    def handle(self, context: JobContext) -> None:
        note(self.log, "started")
        time.sleep(30)


@dataclass
class Hog(Job):
    NAME = "timeouts.hog"
    TIMEOUT = 10
    MEMORY_LIMIT = 512 * 1024 * 1024

    megabytes: int = 0

    def handle(self, context: JobContext) -> None:
        block = bytearray(self.megabytes * 1024 * 1024)
        block[-1] = 1


@dataclass
class FromContainer(Job):
    NAME = "timeouts.from-container"
    TIMEOUT = 10

    log: str = ""

    def handle(self, context: JobContext) -> None:
        note(self.log, str(context.resolve("where")))


@dataclass
class OnceOnly(Job):
    NAME = "timeouts.once-only"

    key: str = "k"
    log: str = ""

    def handle(self, context: JobContext) -> None:
        note(self.log, f"once-only {os.getpid()}")

    def unique_id(self) -> str | None:
        return self.key


@dataclass
class Dispatcher(Job):
    """Dispatches follow-ups from inside its child: through the worker's manager."""

    NAME = "timeouts.dispatcher"
    TIMEOUT = 10

    log: str = ""

    def handle(self, context: JobContext) -> None:
        manager = context.resolve(QueueManager)
        ids = [manager.dispatch(OnceOnly(log=self.log)), manager.dispatch(OnceOnly(log=self.log))]
        note(self.log, f"dispatched {ids[0] is not None} {ids[1] is None}")


def child_setup() -> Container:
    """A ``child_setup`` hook: the child gets a container of its own."""
    return Container().instance("where", f"child-setup in {os.getpid()}")


@dataclass
class Forks(Job):
    """Starts a grandchild process (noting its pid), then overruns its limit or returns."""

    NAME = "timeouts.forks"
    TIMEOUT = 1

    log: str = ""
    overrun: bool = True
    #: The grandchild starts a session of its own, so it leaves the child's process group.
    session: bool = False

    def handle(self, context: JobContext) -> None:
        import subprocess

        grandchild = subprocess.Popen(["sleep", "300"], start_new_session=self.session)
        note(self.log, str(grandchild.pid))
        if self.overrun:
            time.sleep(60)


@dataclass
class ForksUnhurried(Forks):
    """:class:`Forks` with time to spare: only the worker's stop ends it."""

    NAME = "timeouts.forks-unhurried"
    TIMEOUT = 60


@dataclass
class Daemonizes(Job):
    """Starts a process that starts a session leader and exits at once, as a daemon
    does; notes the orphan's pid, its parent once orphaned, and this process's pid."""

    NAME = "timeouts.daemonizes"
    TIMEOUT = 5

    log: str = ""

    def handle(self, context: JobContext) -> None:
        import subprocess

        starts = "setsid sleep 300 >/dev/null 2>&1 & echo $!"
        orphan = int(subprocess.run(["sh", "-c", starts], capture_output=True, check=True).stdout)
        with open(f"/proc/{orphan}/stat", encoding="ascii") as stat:
            parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        note(self.log, f"{orphan} {parent} {os.getpid()}")
        time.sleep(60)


@dataclass
class LeavesAZombie(Job):
    """First run: starts a process that leaves the group and exits once orphaned, so
    it is left a zombie of this child; notes its pid. Second run: notes whether that
    zombie is still there."""

    NAME = "timeouts.leaves-a-zombie"
    TIMEOUT = 10

    log: str = ""
    look: bool = False

    def handle(self, context: JobContext) -> None:
        import subprocess

        if self.look:
            [orphan] = notes(self.log)
            note(self.log, str(os.path.exists(f"/proc/{orphan}")))
            return
        # The orphan exits only once the shell that started it ($0: its pid) has gone and
        # it was adopted, so the shell never reaps it: it is left to this child. Its
        # output goes nowhere, so the run below does not wait for it.
        script = (
            'setsid sh -c \'i=0; while [ "$(cut -d" " -f4 /proc/$$/stat)" = "$0" ] && [ $i -lt 1000 ]; '
            'do i=$((i+1)); sleep 0.01; done\' "$$" >/dev/null 2>&1 & echo $!'
        )
        orphan = int(subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until it has exited, unreaped
            with open(f"/proc/{orphan}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        note(self.log, str(orphan))


@dataclass
class TimedLimited(Job):
    """A timed job behind a rate limit of one a minute: the limit is checked in the worker."""

    NAME = "timeouts.limited"
    TIMEOUT = 10

    log: str = ""

    def middleware(self) -> list[Any]:
        from rainier_sync.middleware import RateLimited

        return [RateLimited("timed", limit=1, per=60)]

    def handle(self, context: JobContext) -> None:
        note(self.log, str(os.getpid()))


@dataclass
class TimedThrottled(Job):
    """A timed job that fails in its child; the worker's throttle counts the failure."""

    NAME = "timeouts.throttled"
    TIMEOUT = 10
    TRIES = 5

    log: str = ""

    def middleware(self) -> list[Any]:
        from rainier_sync.middleware import ThrottlesExceptions

        return [ThrottlesExceptions(max_exceptions=1, decay=60)]

    def handle(self, context: JobContext) -> None:
        note(self.log, str(os.getpid()))
        raise RuntimeError("failed in the child")


ALL: tuple[type[Job], ...] = (
    TimedLimited,
    TimedThrottled,
    Forks,
    ForksUnhurried,
    Daemonizes,
    LeavesAZombie,
    Noop,
    Untimed,
    Sleeper,
    Spinner,
    BlockedRead,
    Stubborn,
    Exits,
    Segfaults,
    WaitsToBeKilled,
    Raises,
    RaisesInThread,
    Cooperative,
    Slow,
    Hog,
    FromContainer,
    OnceOnly,
    Dispatcher,
)


def broken_child_setup() -> None:
    raise RuntimeError("no database in this child")


@job_function("timeouts.fn.note-pid", timeout=10, keep_result=60)
def note_pid(log: str) -> int:
    """A function job with a time limit: runs in a child, notes the child's pid."""
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return os.getpid()
