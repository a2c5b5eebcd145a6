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
:class:`~rainier_sync.execution.Executor`, exactly as for an in-thread
attempt, so events, retries, ``failed()`` and the failed store read the same.
This module is the parent's side; :mod:`rainier_sync.worker.child` the other.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING, Any, Callable

from .. import _clock, signals
from .._text import escaped
from ..errors import JobCrashedError, JobTimeoutError, PayloadError, UnknownJobError
from ..execution import INTERRUPTED, PROCESSED, Completion, Executor
from ..scopes import attempt_scopes
from ..types import ExceptionInfo, QueuedJob, decode, encode
from .child import ForkServer, flush_stdio, kill_group
from .children import _Child, _describe_status

if TYPE_CHECKING:
    from ..jobs import Job, JobContext
    from ..manager import QueueManager

__all__ = ["Supervisor"]

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


class _ChildAttemptFailed(Exception):
    """Carries a failed child attempt out through the job's middleware (which may
    count it, as ``ThrottlesExceptions`` does) to the supervisor."""

    def __init__(self, completion: Completion) -> None:
        super().__init__(completion.info.error if completion.info is not None else completion.outcome.value)
        self.completion = completion


class Supervisor:
    """A pool of reusable child processes for one worker's timed attempts.

    :meth:`run` is called by a pool thread; each pool thread uses at most one
    child at a time, so the pool never grows past the worker's concurrency.
    """

    def __init__(
        self,
        executor: Executor,
        manager: QueueManager,
        *,
        max_jobs_per_child: int | None = None,
        child_setup: Callable[[], Any] | None = None,
    ) -> None:
        self.executor = executor
        self.manager = manager
        self.max_jobs_per_child = max_jobs_per_child
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
        flush_stdio()
        pid = os.fork()
        if pid == 0:  # the fork server; never returns
            code = 1
            try:
                parent_end.close()
                for child in inherited:
                    child.close()
                executor = self.executor
                ForkServer(server_end, executor.registry, executor.container, self.manager, self.child_setup).serve()
                code = 0
            except BaseException:  # noqa: BLE001 - a forked process must never unwind into the parent's code
                try:
                    log.exception("the rainier_sync fork server failed")
                except BaseException:  # noqa: BLE001, S110
                    pass
            finally:
                flush_stdio()
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
            kill_group(child.pid, signal.SIGKILL)
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
            chain = executor.middleware_chain(queued, job)
            if executor.skipped_batch(queued, context):
                return executor.decided(queued, context.decision or ("skip", 0.0, ""), _clock.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - an unknown name or a bad payload fails the job, not the worker
            return executor.conclude(queued, None, exc, context, _clock.monotonic() - started)
        if not chain:
            return self._in_child(queued, job, context, timeout, stop_requested, started)
        # The middleware runs here, in the worker; only the attempt itself runs in the child.
        done: list[Completion] = []

        def attempt() -> None:
            completion = self._in_child(queued, job, context, timeout, stop_requested, started)
            done.append(completion)
            if completion.outcome is not PROCESSED:
                raise _ChildAttemptFailed(completion)

        try:
            with attempt_scopes(queued):  # the middleware runs here, as it would in a thread
                executor.through(chain, job, context, attempt)
        except _ChildAttemptFailed as failed:
            return failed.completion
        except Exception as exc:  # noqa: BLE001 - a middleware that raises fails the attempt, not the worker
            return executor.conclude(queued, job, exc, context, _clock.monotonic() - started)
        if done:
            return done[0]
        assert context.decision is not None, "the middleware neither ran the attempt nor deferred or skipped it"
        return executor.decided(queued, context.decision, _clock.monotonic() - started)

    def _in_child(
        self,
        queued: QueuedJob,
        job: Job,
        context: JobContext,
        timeout: float,
        stop_requested: threading.Event,
        started: float,
    ) -> Completion:
        """The attempt itself, in a child process, concluded here."""
        executor = self.executor
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
            with attempt_scopes(queued):  # the child's dispatches are sent from here
                outcome = self._await(child, timeout, stop_requested, handed)
            reusable = outcome.get("op") == "done"
        except (OSError, ValueError) as exc:
            # the child cannot be talked to (or talks nonsense): stop it; the attempt counts as crashed
            log.warning("lost touch with the child process running job %s: %s", escaped(queued.id), escaped(exc))
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
            return executor.conclude(queued, job, None, context, duration, value=outcome.get("value"))
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
        from ..manager import instance

        try:
            target = self.manager if message.get("manager") == "worker" else instance()
            name = message.get("connection")
            connection = target.connection(name).connection
            jobs = [QueuedJob.from_wire(wire, connection=connection) for wire in message.get("jobs", ())]
            return {"op": "sent", "ids": target.send_queued(name, jobs)}
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
