"""The child side of supervised attempts: the fork server and the children it forks.

Everything here runs after a fork and never returns into the worker's code.
See :mod:`rainier_sync.worker.supervisor` for the parent side.
"""

from __future__ import annotations

import contextlib
import ctypes
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

from ..errors import ConfigurationError, PayloadError, RainierError, UnknownJobError
from ..execution import check_result, context_for
from ..scopes import attempt_scopes
from ..types import ExceptionInfo, QueuedJob, decode, encode

if TYPE_CHECKING:
    from ..container import Container
    from ..manager import QueueManager
    from ..registry import JobRegistry

__all__ = ["ForkServer", "supported", "load_child_setup", "kill_group", "flush_stdio", "READ"]

log = logging.getLogger("rainier_sync")

#: Bytes read from a socket at a time.
READ = 65536
#: Longest the exiting fork server waits for what its children left running to die, in seconds.
EXIT_WAIT = 5.0
#: ``prctl`` option (Linux): orphaned descendants re-parent to the caller, not to init.
_PR_SET_CHILD_SUBREAPER = 36


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


def flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream must not stop a fork
            pass


def kill_group(leader: int, sig: int) -> bool:
    """Signal the process group a child leads (it outlives the child while any of
    the job's own processes are left in it); False when there is no such group."""
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def become_subreaper() -> bool:
    """Linux: make this process the one its orphaned descendants re-parent to (a
    child subreaper), so none of them escapes it; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _children_of_this_process() -> list[int]:
    """The children of this single-threaded process, zombies included (Linux ``/proc``)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as listing:
            return [int(child) for child in listing.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: read every process's parent
        pass
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return found


# -- the fork server and the children (run after fork; never return) ------------------------


class ForkServer:
    """Forks children on the parent's request and reports how they exited."""

    def __init__(
        self,
        control: socket.socket,
        registry: JobRegistry,
        container: Container,
        manager: QueueManager,
        child_setup: Callable[[], Any] | None,
    ) -> None:
        self.control = control
        self.registry = registry
        self.container = container
        self.manager = manager
        self.child_setup = child_setup
        self.children: set[int] = set()
        self.subreaper = False

    def serve(self) -> None:
        # Terminal signals go to the worker, which decides; children leave with their parent.
        os.setpgid(0, 0)
        # What a dead child leaves running (a process in a session of its own is outside
        # its group) re-parents here, to be killed: see _kill_adopted.
        self.subreaper = become_subreaper()
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
                kill_group(pid, signal.SIGKILL)
            self._outlive_children(wake_read)

    def _outlive_children(self, wake_read: int) -> None:
        """Stay until the children and what they left running are dead: each of
        those is adopted here as its parent dies, and killed."""
        if not self.subreaper:
            return
        poller = select.poll()
        poller.register(wake_read, select.POLLIN)
        deadline = time.monotonic() + EXIT_WAIT
        while True:
            self._reap()
            left = deadline - time.monotonic()
            if not _children_of_this_process() or left <= 0:
                return
            with contextlib.suppress(InterruptedError):
                poller.poll(min(100, int(left * 1000) + 1))  # SIGCHLD wakes it
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)

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
                _child_main(socket.socket(fileno=fd), self.registry, self.container, self.manager, self.child_setup)
                code = 0
            except _Terminated:
                pass
            except BaseException:  # noqa: BLE001 - never unwind into the fork server's loop
                try:
                    log.exception("a rainier_sync child process failed")
                except BaseException:  # noqa: BLE001, S110
                    pass
            finally:
                flush_stdio()
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
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                break
            if pid == 0:
                break
            if pid not in self.children:
                continue  # one adopted, and killed, below
            self.children.discard(pid)
            try:
                self.control.send(encode({"op": "exited", "pid": pid, "status": status}).encode())
            except OSError:
                pass
        self._kill_adopted()

    def _kill_adopted(self) -> None:
        """SIGKILL every process adopted here: it outlived the child that led to it.
        Its own children are adopted in turn when it dies, and killed on the next
        call (SIGCHLD wakes the server). An adopted pid cannot be reused before it
        is reaped here, so the signal reaches no stranger."""
        if not self.subreaper:
            return
        for pid in _children_of_this_process():
            if pid not in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


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
    # What a job starts and leaves the group stays under this process while it lives
    # (when it dies, the fork server adopts and kills it).
    adopts = become_subreaper()
    setup_failed: dict[str, Any] | None = None
    if child_setup is not None:
        try:
            made = child_setup()
            if made is not None:
                from ..container import Container as ContainerClass

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
                data = sock.recv(READ)
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
        if adopts:
            _reap_exited()


def _reap_exited() -> None:
    """Between attempts, reap the children that have exited: orphans adopted from
    the job's processes (and any child the job did not wait for) would otherwise
    stay zombies until this process exits."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _forward_dispatches(
    sock: socket.socket, manager: QueueManager, replies: queue_module.SimpleQueue[dict[str, Any] | None]
) -> None:
    """Route what a job dispatches from a child through the worker's own manager
    (its drivers, connections and lock store), not through this process's copy."""
    from ..manager import instance_or_none

    managers = {"worker": manager}
    process_wide = instance_or_none()
    if process_wide is not None and process_wide is not manager:
        managers["instance"] = process_wide
    lock = threading.Lock()

    def forwarding(which: str) -> Callable[[str | None, list[QueuedJob]], list[str | None]]:
        def send(name: str | None, jobs: list[QueuedJob]) -> list[str | None]:
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
        target.route_sends(forwarding(which))


def _child_attempt(
    message: dict[str, Any], stop_requested: threading.Event, registry: JobRegistry, container: Container, resource: Any
) -> dict[str, Any]:
    started = time.monotonic()
    limit_set = None
    returned: Any = None
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
            with attempt_scopes(queued):
                returned = job.handle(context)
            if job.KEEP_RESULT is not None:
                check_result(job, returned)
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
    done: dict[str, Any] = {"op": "done", "ok": True, "duration": time.monotonic() - started}
    if job.KEEP_RESULT is not None:
        done["value"] = returned
    return done
