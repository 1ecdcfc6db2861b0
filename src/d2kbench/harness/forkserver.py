"""The worker fork server: sandboxed CPU workers started by ``fork`` from a process that has
already imported torch and Triton, instead of a fresh interpreter each.

A worker started the plain way (``bwrap ... python -m d2kbench.harness.worker_boot``) takes
1.1 s from spawn to ``ready`` on an idle 2-core CI machine, most of it importing torch and Triton
(``devtools/sandbox_startup.py``, ``results/cpu/sandbox/``; more on a loaded one), and the test
suite starts about 250 of them; a forked one 0.07 s. With the fork server:

1. the parent (:class:`d2kbench.harness.process.WorkerHandle`) still builds the worker's
   bubblewrap sandbox from its policy, exactly as before, but runs a placeholder in it (a bare,
   non-dumpable interpreter that says it is up and waits) instead of the worker;
2. it asks this server (one per parent process, started on first use with the sandbox's
   cleared environment; it imported torch, Triton and the worker's modules once) to fork;
3. the forked child leaves the server's session, closes every descriptor but the worker's pipe
   and log, enters the placeholder's sandbox (:func:`d2kbench.sandbox.nsenter.enter`: its
   namespaces and root, every capability dropped), and forks the worker, which lands in the
   sandbox's PID namespace; the worker starts a session of its own there (group-wide signals and
   priorities reach nobody else), checks that it holds no capability, takes the
   worker's environment and working directory and serves the parent's pipe as a plain worker
   does (:func:`d2kbench.harness.worker_boot.serve`: the seccomp filter, then the solution);
4. the child outside waits for the worker and writes its wait status to a pipe of the parent,
   which reports how the worker ended (a signal such as ``SIGSYS``, an exit code) as before.

The sandbox is per worker as before, so one solution never sees another's files; the server
runs only the project's code, never a solution's. Killing the sandbox (its bubblewrap
process) kills the worker with it (the PID namespace's first process dies). CPU only: on the GPU
a worker's start-up is small next to CUDA's initialisation and Triton's compilation.
``D2K_WORKER_START=exec`` turns it off; where the server cannot start or enter a sandbox, the
harness says so once on stderr and starts workers the plain way.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

#: Values of ``D2K_WORKER_START``: ``auto`` (fork on the CPU where there is a sandbox) or ``exec``.
MODES = ("auto", "exec")
#: The sandbox's placeholder: says it is up (one byte on stdout), then waits to be killed.
PLACEHOLDER = ("import ctypes, os, signal; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE 0: no
               "os.write(1, b'u'); signal.pause()")  # /proc/<pid>/mem for the worker, which has no CAP_SYS_PTRACE
_MAX_MESSAGE = 1 << 20

# Imports inside functions: the parent's side loads nothing heavy (the server's process imports torch,
# Triton and the worker's modules in _preload), and the sandbox's modules load where they run.


class ForkServerUnavailable(RuntimeError):
    """The fork server could not start, or could not start a worker (the message says why)."""


def mode() -> str:
    """``D2K_WORKER_START`` (``auto`` when unset).

    Raises:
        ValueError: an unknown value.
    """
    from d2kbench.sandbox.bwrap import env_mode

    return env_mode("D2K_WORKER_START", MODES)


def wanted(device: str, sandboxed: bool) -> bool:
    """Whether a worker on ``device`` starts through the fork server: a CPU worker in a
    bubblewrap sandbox on Linux, unless ``D2K_WORKER_START=exec``."""
    return device == "cpu" and sandboxed and sys.platform.startswith("linux") and mode() == "auto"


# ----------------------------------------------------------------------------- the server side

def _preload() -> None:
    """Import what every CPU worker imports (torch, Triton under its interpreter, the worker's
    modules), so that forked workers start with them loaded."""
    import torch  # noqa: F401
    import torch.multiprocessing  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    from d2kbench.checking import inputs  # noqa: F401
    from d2kbench.harness import interpreter_numerics, timing, worker, worker_boot  # noqa: F401
    from d2kbench.integrity import guard  # noqa: F401
    from d2kbench.tasks import loader  # noqa: F401


def _worker(sock_fd: int, log_fd: int, status_w: int, env: dict, cwd: str) -> None:  # pragma: no cover - forked
    """The forked worker, inside the sandbox's namespaces: check, settle, serve; never returns."""
    from d2kbench.sandbox.nsenter import confinement_problems

    os.setsid()  # a session and process group of its own inside the sandbox, as bubblewrap's --new-session
    problems = confinement_problems()
    if os.getsid(0) != os.getpid() or os.getpgid(0) != os.getpid():
        problems.append("not the leader of its own session and process group")
    if problems:
        os.write(status_w, ("err the worker is still privileged: " + "; ".join(problems)).encode()[:4000])
        os._exit(1)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in (null, log_fd):
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [worker_boot_path(), str(sock_fd)]  # as a worker started by exec sees it
    tempfile.tempdir = None  # TMPDIR is the worker's own folder now
    random.seed()  # not the server's state, shared by every worker forked from it
    os.write(status_w, b"ok")
    os.close(status_w)
    from d2kbench.harness.worker_boot import serve

    code = 0
    try:
        serve(sock_fd)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - printed to the worker's log, which the parent quotes
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def worker_boot_path() -> str:
    """The file of :mod:`d2kbench.harness.worker_boot` (``sys.argv[0]`` of a worker)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_boot.py")


def _child(request: dict, fds: list[int], report_w: int) -> None:  # pragma: no cover - forked
    """The server's child for one request: enter the sandbox, fork the worker into it, report
    its host PID, then wait for it and hand its wait status to the parent; never returns."""
    from d2kbench.sandbox.nsenter import EnterFailed, enter

    sock_fd, log_fd, exit_w = fds
    os.setsid()  # out of the server's process group: group-wide signals and priorities of a worker stop here
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    keep = {sock_fd, log_fd, exit_w, report_w}
    for fd in _open_fds():
        if fd not in keep and fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    try:
        enter(int(request["target"]))
    except (EnterFailed, KeyError, ValueError) as e:
        os.write(report_w, f"err cannot enter the sandbox: {e}".encode()[:4000])
        os._exit(1)
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        os.close(report_w)
        os.close(exit_w)
        _worker(sock_fd, log_fd, status_w, request["env"], request["cwd"])
    os.close(status_w)
    for fd in (sock_fd, log_fd):
        os.close(fd)
    said = os.read(status_r, 4096)
    os.close(status_r)
    if said.startswith(b"ok"):
        os.write(report_w, f"ok {pid}".encode())
    else:
        os.write(report_w, said or b"err the worker ended before it was ready")
    os.close(report_w)
    _, status = os.waitpid(pid, 0)
    try:
        os.write(exit_w, str(status).encode())
    except OSError:
        pass
    os._exit(0)


def _open_fds() -> list[int]:
    try:
        return [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def serve_requests(sock: socket.socket) -> None:
    """The server's loop: one request at a time until the parent closes its end."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are reaped by the kernel
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        except OSError:
            return
        if not data:
            return
        report_r, report_w = os.pipe()
        try:
            request = json.loads(data)
            if len(fds) != 3:
                raise ValueError(f"{len(fds)} descriptors, expected 3 (pipe, log, exit status)")
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.close(report_r)
                _child(request, fds, report_w)
            os.close(report_w)
            report_w = -1
            answer = _read_all(report_r).decode(errors="replace") or "err the server's child ended without a word"
        except Exception as e:  # noqa: BLE001 - answered, the server goes on
            answer = f"err {type(e).__name__}: {e}"
        finally:
            for fd in (report_r, report_w, *fds):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        sock.sendall(answer.encode())


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 4096):
        out += chunk
    return out


def main(argv: list[str]) -> None:  # pragma: no cover - the server process
    sock = socket.socket(fileno=int(argv[1]))
    try:
        _preload()
    except BaseException as e:  # noqa: BLE001 - said once, then the server ends
        sock.sendall(f"err preload failed: {type(e).__name__}: {e}".encode())
        return
    sock.sendall(b"ready")
    serve_requests(sock)
    os._exit(0)  # the parent is gone: no interpreter teardown of torch


# ----------------------------------------------------------------------------- the parent's side

class ForkServer:
    """The parent's handle on its fork server (started on first use; thread-safe)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.home: str | None = None
        self.lock = threading.Lock()
        self.owner = os.getpid()  # a forked copy of the parent leaves the parent's server alone

    def _start(self, timeout_s: float) -> None:
        from d2kbench.sandbox.policy import sandbox_env
        from d2kbench.sandbox.process import unprivileged_child

        self.home = tempfile.mkdtemp(prefix="d2k-forkserver-")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = sandbox_env(self.home, {"TRITON_INTERPRET": "1"})
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "d2kbench.harness.forkserver", str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                         cwd=self.home,  # its own session, dies with this thread, no capabilities
                                         preexec_fn=unprivileged_child)
        finally:
            theirs.close()
        self.sock = mine
        said = self._answer(timeout_s, "start")
        if said != "ready":
            self.stop()
            raise ForkServerUnavailable(f"the worker fork server did not start: {said}")

    def _answer(self, timeout_s: float, what: str) -> str:
        if self.sock is None:
            raise ForkServerUnavailable("the worker fork server is not running")
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        if not ready:
            self.stop()
            raise ForkServerUnavailable(f"the worker fork server did not answer {what!r} within {timeout_s:.0f} s")
        data = self.sock.recv(_MAX_MESSAGE)
        if not data:
            self.stop()
            raise ForkServerUnavailable(f"the worker fork server ended during {what!r}")
        return data.decode(errors="replace")

    def spawn(self, target_pid: int, sock_fd: int, log_fd: int, exit_fd: int, env: dict[str, str], cwd: str,
              timeout_s: float = 60.0) -> int:
        """Fork a worker into the sandbox of ``target_pid`` (a host PID of a process inside it).

        Args:
            sock_fd: the worker's end of its pipe to the parent.
            log_fd: the worker's stdout and stderr (its log file, open for appending).
            exit_fd: the write end of a pipe that gets the worker's wait status (decimal) when it ends.
            env: the worker's complete environment; cwd: its working directory (inside the sandbox).

        Returns:
            The worker's host PID.

        Raises:
            ForkServerUnavailable: the server did not start or the worker could not be started.
        """
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.stop()
                self._start(timeout_s)
            msg = json.dumps({"target": int(target_pid), "env": env, "cwd": cwd}).encode()
            try:
                if self.sock is None:
                    raise OSError("no connection")
                socket.send_fds(self.sock, [msg], [sock_fd, log_fd, exit_fd])
            except OSError as e:
                self.stop()
                raise ForkServerUnavailable(f"cannot reach the worker fork server: {e}") from None
            said = self._answer(timeout_s, "fork")
        if not said.startswith("ok "):
            raise ForkServerUnavailable(said.removeprefix("err ").strip())
        return int(said.split()[1])

    def stop(self) -> None:
        """End the server (its children, the workers, live on until their sandboxes end)."""
        if os.getpid() != self.owner:
            return
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None


_SERVER: ForkServer | None = None
_SERVER_PID = 0
_SERVER_LOCK = threading.Lock()


def server() -> ForkServer:
    """This process's fork server (created on first use, stopped at exit)."""
    global _SERVER, _SERVER_PID
    with _SERVER_LOCK:
        if _SERVER is None or _SERVER_PID != os.getpid():  # a forked copy of this process starts its own
            _SERVER, _SERVER_PID = ForkServer(), os.getpid()
            atexit.register(_SERVER.stop)
        return _SERVER


def shutdown() -> None:
    """Stop this process's fork server if it has one (before an exit that skips ``atexit``'s
    later handlers, such as the CLI's re-raised SIGTERM)."""
    if _SERVER is not None:
        _SERVER.stop()


if __name__ == "__main__":
    main(sys.argv)
