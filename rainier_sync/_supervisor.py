"""Supervised child processes that run the attempts of jobs with a time limit.

A Python thread cannot be killed, so an attempt with a time limit runs in a
child process the worker can kill. Layout:

- The **fork server** is forked from the worker's owning thread when the
  worker starts, before the pool threads exist, so it is a single-threaded
  copy of the application: registry, container, imported modules. It does
  nothing but fork children on request and report how they exited.
- Each **child** is forked from the fork server (a single-threaded process,
  so forking it is safe) and runs attempts one after another, reused until it
  has run ``max_jobs_per_child`` attempts, is killed, or crashes.
- The parent talks to a child over a socket pair in newline-delimited JSON:
  the job's envelope goes down, the outcome (or the failure as an
  :class:`~rainier_sync.types.ExceptionInfo`) comes back. Nothing is pickled.

The parent decides what an outcome means with the worker's
:class:`~rainier_sync._execution.Executor`, exactly as for an in-thread
attempt, so events, retries, ``failed()`` and the failed store read the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import logging
import os
import queue as queue_module
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable

from . import _clock, signals
from ._execution import INTERRUPTED, Completion, context_for
from .errors import ConfigurationError, JobCrashedError, JobTimeoutError, PayloadError, RainierError, UnknownJobError
from .types import ExceptionInfo, QueuedJob, decode, encode

if TYPE_CHECKING:
    from .container import Container
    from .manager import QueueManager
    from .registry import JobRegistry
    from .worker import Worker

__all__ = ["Supervisor", "supported", "load_child_setup"]

log = logging.getLogger("rainier_sync")

#: How much sooner than its limit an attempt's ``stop_requested`` is set: a
#: tenth of the limit, at most one second.
SOFT_MARGIN_MAX = 1.0
#: Seconds between SIGTERM and SIGKILL for a child that overran.
KILL_GRACE = 1.0
#: Longest wait for the fork server to answer (start a child, report an exit).
SERVER_TIMEOUT = 10.0
#: Longest slice a waiting pool thread sleeps before looking at the stop flag.
_SLICE = 0.1
_READ = 65536


def supported() -> bool:
    """Whether this platform can run supervised children (POSIX ``fork`` and
    descriptor passing)."""
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")


def load_child_setup(path: str | None) -> Callable[[], Any] | None:
    """Resolve ``"package.module:function"``; a :class:`ConfigurationError` naming
    what is wrong, at boot."""
    if path is None:
        return None
    if not isinstance(path, str) or path.count(":") != 1:
        raise ConfigurationError(f"worker option child_setup must be 'package.module:function', got {path!r}")
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"worker option child_setup {path!r}: cannot import {module_name!r}: {exc}") from None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigurationError(f"worker option child_setup {path!r}: {module_name} has no {attribute!r}")
    if not callable(target):
        raise ConfigurationError(f"worker option child_setup {path!r} is not callable")
    setup: Callable[[], Any] = target
    return setup


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream must not stop a fork
            pass


def _describe_status(status: int | None) -> str:
    if status is None:
        return "its exit status is unknown"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"it was killed by {name}"
    return f"it exited with code {code}"


# -- the parent side -----------------------------------------------------------------------


def _kill_group(leader: int, sig: int) -> None:
    """Signal the process group a child leads (it outlives the child while any of
    the job's own processes are left in it)."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Child:
    """The parent's handle on one child process."""

    __slots__ = ("pid", "sock", "pidfd", "attempts", "buffer", "alive", "reaped", "poller")

    def __init__(self, pid: int, sock: socket.socket, pidfd: int | None) -> None:
        self.pid = pid
        self.sock = sock
        self.pidfd = pidfd
        self.attempts = 0
        self.buffer = bytearray()
        self.alive = True
        self.reaped = False
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(encode(message).encode() + b"\n")

    def next_message(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None when ``timeout`` passed first; EOFError when the child is gone."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                message = decode(line)
                if not isinstance(message, dict):
                    raise EOFError("the child sent something that is not a message")
                return message
            if not self.alive:
                raise EOFError("the child is gone")
            if not self.poller.poll(max(0, int(timeout * 1000 + 0.999))):
                return None
            try:
                data = self.sock.recv(_READ)
            except OSError:
                data = b""
            if not data:
                self.alive = False
                raise EOFError("the child is gone")
            self.buffer += data
            timeout = 0.0

    def idle_and_alive(self) -> bool:
        """A child waiting for work has nothing to say: anything readable means it is gone."""
        return self.alive and not self.buffer and not self.poller.poll(0)

    def wait_gone(self, timeout: float, said: list[dict[str, Any]] | None = None) -> bool:
        """Read whatever the child still sends (kept in ``said``) until it exits; True once it has."""
        deadline = _clock.monotonic() + timeout
        while self.alive:
            left = deadline - _clock.monotonic()
            if left <= 0:
                return False
            try:
                message = self.next_message(left)
            except (EOFError, ValueError):
                self.alive = False
                break
            if message is not None and said is not None:
                said.append(message)
        return True

    def kill(self, sig: int) -> None:
        """Signal the child and every process it started: the child leads a process
        group of its own, so a job's own subprocesses go with it."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        _kill_group(self.pid, sig)

    def close(self) -> None:
        self.alive = False
        try:
            self.sock.close()
        finally:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None


class Supervisor:
    """A pool of reusable child processes for one worker's timed attempts.

    :meth:`run` is called by a pool thread; each pool thread uses at most one
    child at a time, so the pool never grows past the worker's concurrency.
    """

    def __init__(self, worker: Worker, *, child_setup: Callable[[], Any] | None = None) -> None:
        self.worker = worker
        self.executor = worker.executor
        self.max_jobs_per_child = worker.options.max_jobs_per_child
        self.kill_grace = KILL_GRACE
        self.child_setup = child_setup
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._idle: list[_Child] = []
        self._busy: dict[int, _Child] = {}
        self._statuses: dict[int, int] = {}
        self._forget: set[int] = set()
        self._status_changed = threading.Condition(self._lock)
        self._spawned: dict[int, tuple[int, int | None, str | None]] = {}
        self._tokens = 0
        self._interrupt = threading.Event()
        self._closed = False
        self._server_pid: int | None = None
        self._control: socket.socket | None = None
        self._reader: threading.Thread | None = None
        #: Children started so far (replacements included).
        self.started = 0

    # -- the fork server ---------------------------------------------------------
    def start(self) -> None:
        """Fork the fork server. Call from the owning thread, before the pool threads start."""
        parent_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with self._lock:  # a restarted fork server must not hold the sockets of earlier children open
            inherited = [*self._idle, *self._busy.values()]
        _flush_stdio()
        pid = os.fork()
        if pid == 0:  # the fork server; never returns
            code = 1
            try:
                parent_end.close()
                for child in inherited:
                    child.close()
                _ForkServer(server_end, self.worker, self.child_setup).serve()
                code = 0
            except BaseException:  # noqa: BLE001 - a forked process must never unwind into the parent's code
                try:
                    log.exception("the rainier_sync fork server failed")
                except BaseException:  # noqa: BLE001, S110
                    pass
            finally:
                _flush_stdio()
                os._exit(code)
        server_end.close()
        self._server_pid = pid
        self._control = parent_end
        self._reader = threading.Thread(
            target=self._read_server, args=(parent_end, pid), name="rainier-fork-server", daemon=True
        )
        self._reader.start()

    def _read_server(self, control: socket.socket, pid: int) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(control, 4096, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            try:
                message = decode(data)
            except ValueError:
                continue
            with self._lock:
                if message.get("op") == "spawned":
                    token, pidfd = int(message["token"]), fds[0] if fds else None
                    if token == self._tokens:
                        self._spawned[token] = (int(message["pid"]), pidfd, message.get("error"))
                    elif pidfd is not None:  # an answer that came too late: that child reads EOF and exits
                        os.close(pidfd)
                elif message.get("op") == "exited":
                    child_pid = int(message["pid"])
                    if child_pid in self._forget:
                        self._forget.discard(child_pid)
                    else:
                        self._statuses[child_pid] = int(message["status"])
                self._status_changed.notify_all()
        with self._lock:
            if self._server_pid == pid:
                self._server_pid = None
            self._status_changed.notify_all()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    def _spawn(self) -> _Child:
        with self._spawn_lock:
            if self._server_pid is None or self._control is None:
                if self._closed:
                    raise RuntimeError("the supervisor is closed")
                log.warning("the rainier_sync fork server is gone; starting a new one from a running worker")
                if self._control is not None:
                    self._control.close()
                self.start()
            control = self._control
            assert control is not None
            with self._lock:
                self._tokens += 1
                token = self._tokens
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(control, [encode({"op": "spawn", "token": token}).encode()], [theirs.fileno()])
            except OSError as exc:
                ours.close()
                raise RuntimeError(f"the fork server does not answer: {exc}") from exc
            finally:
                theirs.close()
            deadline = _clock.monotonic() + SERVER_TIMEOUT
            with self._lock:
                while token not in self._spawned:
                    left = deadline - _clock.monotonic()
                    if left <= 0 or self._server_pid is None:
                        ours.close()
                        raise RuntimeError("the fork server did not start a child process")
                    self._status_changed.wait(left)
                pid, pidfd, error = self._spawned.pop(token)
            if error is not None:
                ours.close()
                raise RuntimeError(f"the fork server could not fork: {error}")
            self.started += 1
            return _Child(pid, ours, pidfd)

    def _exit_status(self, child: _Child, timeout: float) -> int | None:
        deadline = _clock.monotonic() + timeout
        with self._lock:
            while child.pid not in self._statuses:
                left = deadline - _clock.monotonic()
                if left <= 0 or self._server_pid is None:
                    return None
                self._status_changed.wait(left)
            child.reaped = True
            return self._statuses.pop(child.pid)

    # -- the pool ------------------------------------------------------------------
    def _acquire(self) -> _Child:
        while True:
            with self._lock:
                child = self._idle.pop() if self._idle else None
            if child is None:
                child = self._spawn()
                break
            if child.idle_and_alive():
                break
            self._give_back(child, reusable=False)  # died while idle (killed by hand, OOM)
        with self._lock:
            self._busy[child.pid] = child
        return child

    def _give_back(self, child: _Child, *, reusable: bool) -> None:
        with self._lock:
            self._busy.pop(child.pid, None)
            keep = reusable and not self._closed and child.alive
            if keep and self.max_jobs_per_child is not None and child.attempts >= self.max_jobs_per_child:
                keep = False
            if keep:
                self._idle.append(child)
                return
            if not child.reaped and self._statuses.pop(child.pid, None) is None:
                self._forget.add(child.pid)
        # A retired child reads EOF and exits on its own; one that is gone is only closed.
        child.close()

    def busy(self) -> int:
        """How many children are running an attempt."""
        with self._lock:
            return len(self._busy)

    def pids(self) -> list[int]:
        """The process ids of the live children."""
        with self._lock:
            return [c.pid for c in self._idle] + list(self._busy)

    def interrupt(self) -> None:
        """Stop the attempts running in children (the worker's grace is over):
        each is killed and comes back abandoned, to be released."""
        self._interrupt.set()

    def close(self) -> None:
        """Stop every child and the fork server."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        self._interrupt.set()
        for child in idle:
            child.close()
            # An idle child exits when it reads EOF; what its jobs left running does not.
            _kill_group(child.pid, signal.SIGKILL)
        control, self._control = self._control, None
        if control is not None:
            try:
                control.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            control.close()
        if self._reader is not None:
            self._reader.join(timeout=SERVER_TIMEOUT)

    # -- one attempt -----------------------------------------------------------------
    def run(self, queued: QueuedJob, timeout: float, stop_requested: threading.Event) -> Completion:
        """Run one attempt in a child, killing it when it overruns ``timeout`` seconds."""
        executor = self.executor
        lost = executor.lost(queued)
        if lost is not None:
            return lost
        context = executor.context(queued, stop_requested)
        signals.emit(signals.job_processing, executor.sender, job=queued, connection=queued.connection)
        started = _clock.monotonic()
        try:
            job = executor.build(queued)
        except Exception as exc:  # noqa: BLE001 - an unknown name or a bad payload fails the job, not the worker
            return executor.conclude(queued, None, exc, context, _clock.monotonic() - started)
        try:
            child = self._acquire()
        except Exception as exc:  # noqa: BLE001 - no child: the attempt fails as crashed, the job is kept
            no_child = JobCrashedError(f"job {queued.name!r} ({queued.id}): could not start a child process: {exc}")
            return executor.conclude(queued, job, no_child, context, _clock.monotonic() - started)
        reusable = False
        try:
            child.attempts += 1
            handed = _clock.monotonic()  # the limit starts now: starting a child is not the job's time
            child.send({"op": "run", "job": queued.to_wire(), "connection": queued.connection})
            outcome = self._await(child, timeout, stop_requested, handed)
            reusable = outcome.get("op") == "done"
        except (OSError, ValueError) as exc:
            # the child cannot be talked to (or talks nonsense): stop it; the attempt counts as crashed
            log.warning("lost touch with the child process running job %s: %s", queued.id, exc)
            self._stop_child(child)
            outcome = {"op": "crashed", "status": self._exit_status(child, 2.0)}
        finally:
            self._give_back(child, reusable=reusable)
        duration = _clock.monotonic() - started
        op = outcome.get("op")
        error: BaseException
        if op == "crashed":
            error = JobCrashedError(
                f"the process running job {queued.name!r} ({queued.id}) died: {_describe_status(outcome['status'])}"
            )
            return executor.conclude(queued, job, error, context, duration)
        if op == "abandoned":
            return Completion(queued, INTERRUPTED, duration=duration, interrupted=True)
        if op == "timed_out":
            error = JobTimeoutError(
                f"job {queued.name!r} ({queued.id}) overran its time limit of {timeout:g}s "
                f"and was stopped with {outcome['how']}"
            )
            timed_out = ExceptionInfo.from_exception(error)
            if outcome.get("stack"):  # where the job was when its time ran out
                timed_out = dataclasses.replace(
                    timed_out,
                    traceback=f"{timed_out.traceback.rstrip()}\n\nThe job was here when it was stopped "
                    f"(most recent call last):\n{outcome['stack']}",
                )
            return executor.conclude(queued, job, error, context, duration, info=timed_out)
        if outcome.get("ok"):
            return executor.conclude(queued, job, None, context, duration)
        info = ExceptionInfo.from_dict(outcome.get("error"))
        permanent: BaseException | None = None
        if outcome.get("permanent"):
            permanent = UnknownJobError(info.message) if outcome.get("unknown") else PayloadError(info.message)
        return executor.conclude(queued, job, permanent, context, duration, info=info)

    def _await(self, child: _Child, timeout: float, stop_requested: threading.Event, started: float) -> dict[str, Any]:
        """Wait for the child's answer; kill it when its time is up or the worker gives up on it.
        Returns the child's ``done`` message, or ``{"op": "timed_out"|"abandoned"|"crashed"}``."""
        hard = started + timeout
        soft = hard - min(SOFT_MARGIN_MAX, timeout / 10)
        told = False
        while True:
            now = _clock.monotonic()
            if not told and (now >= soft or stop_requested.is_set()):
                told = True
                try:
                    child.send({"op": "stop"})
                except OSError:
                    pass
            if self._interrupt.is_set():
                stopped = self._stop_child(child)
                return stopped if stopped["op"] == "done" else {"op": "abandoned"}
            if now >= hard:
                stopped = self._stop_child(child)
                return stopped if stopped["op"] == "done" else {**stopped, "op": "timed_out"}
            wake = hard if told else min(soft, hard)
            try:
                message = child.next_message(min(_SLICE, max(0.0, wake - now)))
            except EOFError:
                return {"op": "crashed", "status": self._exit_status(child, 2.0)}
            if message is None:
                continue
            if message.get("op") == "done":
                return message
            if message.get("op") == "send":
                child.send(self._dispatch_for_child(message))

    def _dispatch_for_child(self, message: dict[str, Any]) -> dict[str, Any]:
        """Dispatch what a job in a child dispatched, through this process's manager."""
        from . import manager as manager_module

        try:
            target = self.worker.manager if message.get("manager") == "worker" else manager_module.instance()
            name = message.get("connection")
            connection = target.connection(name).connection
            jobs = [QueuedJob.from_wire(wire, connection=connection) for wire in message.get("jobs", ())]
            return {"op": "sent", "ids": target._send(name, jobs)}
        except Exception as exc:  # noqa: BLE001 - the job in the child gets the error
            return {"op": "sent", "error": ExceptionInfo.from_exception(exc).to_dict()}

    def _stop_child(self, child: _Child) -> dict[str, Any]:
        """SIGTERM, a short grace, then SIGKILL. Returns the child's answer when
        it finished just before it was stopped, else how it was stopped."""
        try:
            late = child.next_message(0.0)
        except EOFError:
            late = None
        if late is not None and late.get("op") == "done":
            return late
        child.kill(signal.SIGTERM)
        how = "SIGTERM"
        said: list[dict[str, Any]] = []
        if not child.wait_gone(self.kill_grace, said):
            child.kill(signal.SIGKILL)
            how = f"SIGKILL, as it outlived SIGTERM by {self.kill_grace:g}s"
            child.wait_gone(SERVER_TIMEOUT, said)
        child.alive = False
        stack = next((m.get("stack") for m in said if m.get("op") == "terminated"), None)
        return {"op": "stopped", "how": how, "stack": stack}


# -- the fork server and the children (run after fork; never return) ------------------------


class _ForkServer:
    def __init__(self, control: socket.socket, worker: Worker, child_setup: Callable[[], Any] | None) -> None:
        self.control = control
        self.worker = worker
        self.child_setup = child_setup
        self.children: set[int] = set()

    def serve(self) -> None:
        # Terminal signals go to the worker, which decides; children leave with their parent.
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        poller = select.poll()
        poller.register(self.control, select.POLLIN)
        poller.register(wake_read, select.POLLIN)
        control_fd = self.control.fileno()
        try:
            while True:
                self._reap()
                try:
                    ready = {fd for fd, _ in poller.poll(1000)}
                except InterruptedError:
                    continue
                if wake_read in ready:
                    try:
                        os.read(wake_read, 512)
                    except BlockingIOError:
                        pass
                if control_fd in ready:
                    try:
                        data, fds, _, _ = socket.recv_fds(self.control, 4096, 1)
                    except InterruptedError:
                        continue
                    except OSError:
                        data, fds = b"", []
                    if not data:
                        return
                    request = decode(data)
                    for fd in fds:
                        self._fork_child(fd, request.get("token"), wake_read, wake_write)
        finally:
            for pid in self.children:
                _kill_group(pid, signal.SIGKILL)

    def _fork_child(self, fd: int, token: Any, wake_read: int, wake_write: int) -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(fd)
            self.control.send(encode({"op": "spawned", "token": token, "pid": 0, "error": str(exc)}).encode())
            return
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)  # a group of its own: killing it kills what the job started too
                signal.set_wakeup_fd(-1)
                os.close(wake_read)
                os.close(wake_write)
                self.control.close()
                worker = self.worker
                _child_main(
                    socket.socket(fileno=fd), worker.registry, worker.container, worker.manager, self.child_setup
                )
                code = 0
            except _Terminated:
                pass
            except BaseException:  # noqa: BLE001 - never unwind into the fork server's loop
                try:
                    log.exception("a rainier_sync child process failed")
                except BaseException:  # noqa: BLE001, S110
                    pass
            finally:
                _flush_stdio()
                os._exit(code)
        os.close(fd)
        try:
            os.setpgid(pid, pid)  # also from here, so the group exists before the worker can signal it
        except OSError:
            pass  # the child did it first, or is already gone
        self.children.add(pid)
        pidfd: list[int] = []
        if hasattr(os, "pidfd_open"):
            try:
                pidfd.append(os.pidfd_open(pid))
            except OSError:
                pass
        try:
            socket.send_fds(self.control, [encode({"op": "spawned", "token": token, "pid": pid}).encode()], pidfd)
        finally:
            for descriptor in pidfd:
                os.close(descriptor)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            try:
                self.control.send(encode({"op": "exited", "pid": pid, "status": status}).encode())
            except OSError:
                pass


class _Terminated(BaseException):
    """Raised in a child's main thread by SIGTERM, so ``finally`` blocks run before it exits."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _child_main(
    sock: socket.socket,
    registry: JobRegistry,
    container: Container,
    manager: QueueManager,
    child_setup: Callable[[], Any] | None,
) -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    setup_failed: dict[str, Any] | None = None
    if child_setup is not None:
        try:
            made = child_setup()
            if made is not None:
                from .container import Container as ContainerClass

                if not isinstance(made, ContainerClass):
                    raise TypeError(f"child_setup returned {type(made).__name__}, not a Container or None")
                container = made
        except Exception as exc:  # noqa: BLE001 - reported as the failure of the attempt this child was made for
            setup_failed = {"op": "done", "ok": False, "error": ExceptionInfo.from_exception(exc).to_dict()}
    inbox: queue_module.SimpleQueue[tuple[dict[str, Any], threading.Event] | None] = queue_module.SimpleQueue()
    replies: queue_module.SimpleQueue[dict[str, Any] | None] = queue_module.SimpleQueue()
    current: list[threading.Event] = [threading.Event()]
    _forward_dispatches(sock, manager, replies)

    def read() -> None:
        buffer = bytearray()
        while True:
            try:
                data = sock.recv(_READ)
            except OSError:
                data = b""
            if not data:
                replies.put(None)
                inbox.put(None)
                return
            buffer += data
            while True:
                end = buffer.find(b"\n")
                if end < 0:
                    break
                message = decode(bytes(buffer[:end]))
                del buffer[: end + 1]
                if message.get("op") == "run":
                    current[0] = threading.Event()
                    inbox.put((message, current[0]))
                elif message.get("op") == "stop":
                    current[0].set()
                elif message.get("op") == "sent":
                    replies.put(message)

    threading.Thread(target=read, name="rainier-child-reader", daemon=True).start()
    try:
        import resource
    except ImportError:  # pragma: no cover - POSIX has it
        resource = None  # type: ignore[assignment]
    while True:
        item = inbox.get()
        if item is None:
            return
        message, stop_requested = item
        try:
            answer = setup_failed or _child_attempt(message, stop_requested, registry, container, resource)
        except _Terminated as stopped:
            # SIGTERM: tell the worker where the job was, then leave (finally blocks have run)
            frames = traceback.extract_tb(stopped.__traceback__)[1:-1]  # not this loop, not the handler
            stack = "".join(traceback.format_list(frames))
            with contextlib.suppress(OSError):
                sock.sendall(encode({"op": "terminated", "stack": stack}).encode() + b"\n")
            raise
        try:
            sock.sendall(encode(answer).encode() + b"\n")
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET):
                return
            raise
        if setup_failed is not None:
            return  # a child that could not set up is replaced


def _forward_dispatches(
    sock: socket.socket, manager: QueueManager, replies: queue_module.SimpleQueue[dict[str, Any] | None]
) -> None:
    """Make what a job dispatches from a child go through the worker's own manager
    (its drivers, connections and lock store), not through this process's copy."""
    from . import manager as manager_module

    managers = {"worker": manager}
    if manager_module._instance is not None and manager_module._instance is not manager:
        managers["instance"] = manager_module._instance
    lock = threading.Lock()

    def forwarding(which: str, original: Callable[..., list[str | None]]) -> Callable[..., list[str | None]]:
        def send(name: str | None, jobs: list[QueuedJob], within: Any = None) -> list[str | None]:
            if within is not None:  # the caller's own transaction lives in this process
                return original(name, jobs, within)
            request = {"op": "send", "manager": which, "connection": name, "jobs": [job.to_wire() for job in jobs]}
            with lock:
                sock.sendall(encode(request).encode() + b"\n")
                reply = replies.get()
            if reply is None:
                raise RainierError("the worker went away before it took this dispatch")
            if "error" in reply:
                raise RainierError(f"the worker could not dispatch: {ExceptionInfo.from_dict(reply['error']).error}")
            ids: list[str | None] = reply["ids"]
            return ids

        return send

    for which, target in managers.items():
        target._send = forwarding(which, target._send)  # type: ignore[method-assign]


def _child_attempt(
    message: dict[str, Any], stop_requested: threading.Event, registry: JobRegistry, container: Container, resource: Any
) -> dict[str, Any]:
    started = time.monotonic()
    limit_set = None
    signal.signal(signal.SIGTERM, _on_sigterm)  # an earlier job in this child may have changed it
    try:
        queued = QueuedJob.from_wire(message["job"], connection=str(message.get("connection", "default")))
        job_class = registry.get(queued.name)
        job = job_class.from_payload(queued.payload)
        context = context_for(container, queued, stop_requested)
        memory = getattr(job_class, "MEMORY_LIMIT", None)
        if memory is not None and resource is not None:
            if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
                raise PayloadError(
                    f"{job_class.__qualname__}.MEMORY_LIMIT must be a positive number of bytes, got {memory!r}"
                )
            previous = resource.getrlimit(resource.RLIMIT_AS)
            hard = previous[1]
            resource.setrlimit(resource.RLIMIT_AS, (memory if hard < 0 else min(memory, hard), hard))
            limit_set = previous
        try:
            job.handle(context)
        finally:
            if limit_set is not None:
                resource.setrlimit(resource.RLIMIT_AS, limit_set)
            container.flush_scoped()
    except _Terminated:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent whole
        return {
            "op": "done",
            "ok": False,
            "error": ExceptionInfo.from_exception(exc).to_dict(),
            "permanent": isinstance(exc, (UnknownJobError, PayloadError)),
            "unknown": isinstance(exc, UnknownJobError),
            "duration": time.monotonic() - started,
        }
    return {"op": "done", "ok": True, "duration": time.monotonic() - started}
