"""The parent's handle on one worker process: spawn (sandboxed), request/answer with a timeout, kill.

A hang, a crash (segfault, illegal memory access, ``os._exit``) or a forged/incomplete answer
ends the worker only; the caller gets a :class:`WorkerFailure` naming the status and cause.

Each worker runs in an OS sandbox (:mod:`d2kbench.sandbox`): a fresh user/PID/network/IPC
namespace under bubblewrap that sees the Python runtime, the task's public files and a staged
copy of exactly the solution code the static review read, and can write only its private
folder and its compile cache. It dies with the process that started it. The parent is
non-dumpable, so nothing can read its memory (the expected values) through ``/proc``.
On the CPU the worker is forked into that sandbox by :mod:`d2kbench.harness.forkserver`
(torch and Triton imported once per parent instead of once per worker).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.util
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from d2kbench.checking.verdict import WorkerFailure
from d2kbench.harness import forkserver
from d2kbench.integrity.static import solution_files
from d2kbench.phases import phase
from d2kbench.sandbox import bwrap, channel
from d2kbench.sandbox.policy import sandbox_env, worker_policy
from d2kbench.sandbox.process import command_line, descendants, new_group_dying_with_parent, protect_parent, unprivileged_child

#: Files of a task folder a worker reads: the spec, the reference, the declared alternatives.
WORKER_TASK_FILES = ("task.yaml", "reference.py", "alternatives")


def cache_root() -> Path:
    """Where solutions' compile caches live (``D2K_CACHE_DIR``, default ``~/.cache/d2kbench``):
    one folder per solution content and device, so a solution can only ever write (or poison)
    its own cache."""
    return Path(os.environ.get("D2K_CACHE_DIR") or Path.home() / ".cache" / "d2kbench").expanduser()


def solution_cache_dir(solution_path: Path, device: str) -> Path:
    """The compile cache of one solution content on one device (created): keyed by the content
    of every file the worker sees of it (the solution and the modules of its folder that it
    imports), so two solutions that differ only in a helper module never share a cache."""
    h = hashlib.sha256()
    src = Path(solution_path).resolve()
    try:
        files = sorted(solution_files(src))
    except (SyntaxError, ValueError, OSError):  # unreadable imports: the worker reports them
        files = [src]
    for f in files:
        h.update(str(f.relative_to(src.parent) if f.is_relative_to(src.parent) else f.name).encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    digest = h.hexdigest()[:16]
    d = cache_root() / "compile" / f"{Path(solution_path).stem}-{digest}-{device}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def stage_code(solution_path: Path, dest: Path) -> Path:
    """Copy the solution and the modules it imports from its folder (exactly the files the
    static review reads, :func:`d2kbench.integrity.static.solution_files`) into ``dest``,
    keeping their places relative to the solution's folder. Returns the staged solution file."""
    src = Path(solution_path).resolve()
    root = src.parent
    for f in solution_files(src):
        rel = f.relative_to(root) if f.is_relative_to(root) else Path(f.name)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest / rel)
    return dest / src.name


_warned: set[str] = set()
_fork_failed: list[str] = []  # why the fork server failed twice in this process (then: no more tries)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr)


#: Answer kinds a request may legitimately get back, per op.
_EXPECTED = {"call": "outputs", "time": "timing", "exit": "bye"}


class WorkerHandle:
    """One spawned worker running one solution. Use as a context manager."""

    def __init__(self, task_root: Path, solution_path: Path, device: str, timeout_s: float,
                 options: dict | None = None):
        self.task_root = Path(task_root)
        self.solution_path = Path(solution_path)
        self.device = device
        self.timeout_s = timeout_s
        self.options = dict(options or {})
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self.workdir: Path | None = None
        self.log_path: str | None = None
        self.sandbox = ""  # how the worker was isolated (SandboxStatus.describe())
        self.process_filter = ""  # "seccomp" when the worker cannot start processes (untrusted, CPU)
        self.startup_s: dict[str, float] = {}  # the worker's start-up breakdown (seconds, diagnostics)
        self.worker_pid: int | None = None  # a forked worker's host PID (self.proc is then its sandbox)
        self._exit_r: int | None = None  # a forked worker's wait status arrives here (forkserver)
        self._exit_status: int | None = None

    def start(self) -> None:
        """Spawn the worker and wait until it imported the solution.

        Raises:
            WorkerFailure: import failed (``compile_error``), crash or timeout.
        """
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the worker process without waiting for it (see :meth:`wait_ready`).

        Raises:
            d2kbench.sandbox.bwrap.SandboxUnavailable: ``D2K_SANDBOX=require`` without a sandbox.
        """
        st = bwrap.status()
        protect_parent()
        channel.harden_resource_sharer()  # workers fetch their arguments' descriptors from this process
        self.sandbox = st.describe()
        self.workdir = Path(tempfile.mkdtemp(prefix="d2k-worker-"))
        self.log_path = str(self.workdir / "worker.log")
        trusted = bool(self.options.get("trusted"))
        code = self.solution_path.resolve() if trusted else stage_code(self.solution_path, self.workdir / "code")
        cache = solution_cache_dir(self.solution_path, self.device)
        parent_tmp = multiprocessing.util.get_temp_dir()  # the parent's fd-passing socket lives here
        mine, theirs = multiprocessing.Pipe(duplex=True)
        fd = theirs.fileno()
        argv = [sys.executable, "-m", "d2kbench.harness.worker_boot", str(fd)]
        if st.active:
            policy = worker_policy(task_root=self.task_root, task_files=WORKER_TASK_FILES, code=[str(code)],
                                   workdir=self.workdir, cache_dir=cache, device=self.device, parent_tmp=parent_tmp)
            if trusted:  # the task's own reference and alternatives may build on other tasks' code
                policy.hide = []
            env = bwrap.launcher_env(st.binary)
            for attempt in range(2 if forkserver.wanted(self.device, True) and not _fork_failed else 0):
                try:
                    self._spawn_forked(st.binary, policy, env, fd)
                    break
                except forkserver.ForkServerUnavailable as e:  # once more with a fresh sandbox (and server)
                    self.kill_sandbox()
                    if attempt == 1:  # twice: this process starts its workers the plain way from now on
                        _fork_failed.append(str(e))
                        _warn_once(f"d2k: WARNING: the worker fork server is unavailable ({e}); "
                                   "workers start the plain way (slower)")
            cmd = bwrap.command(st.binary, policy, argv)
        else:
            cmd = argv
            env = sandbox_env(str(self.workdir), {"TRITON_CACHE_DIR": str(cache / "triton"),
                                                  "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")})
        if self.proc is None:
            # without a sandbox, at least no capabilities (d2k run as root would hand the worker CAP_SYS_PTRACE)
            preexec = new_group_dying_with_parent if st.active or trusted else unprivileged_child
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(cmd, pass_fds=[fd], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             env=env, cwd=self.workdir, preexec_fn=preexec)
        theirs.close()
        self.conn = mine
        self.conn.send({"authkey": bytes(multiprocessing.current_process().authkey), "task_root": str(self.task_root),
                        "solution_path": str(code), "device": self.device,
                        "options": {**self.options, "spawned_at": time.time(), "sandbox": self.sandbox}})

    def _spawn_forked(self, binary: str, policy: bwrap.Policy, launcher_env: dict[str, str], fd: int) -> None:
        """Start the worker's sandbox with a placeholder in it, then have the fork server fork
        the worker into it (:mod:`d2kbench.harness.forkserver`); the worker gets ``fd`` (its
        pipe), its log, ``policy.env`` and ``policy.chdir``.

        Raises:
            forkserver.ForkServerUnavailable: the sandbox did not come up, or the server could not
                start the worker in it (the caller starts it the plain way).
        """
        assert self.log_path is not None
        cmd = bwrap.command(binary, policy, [sys.executable, "-I", "-S", "-c", forkserver.PLACEHOLDER])
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                         env=launcher_env, cwd=self.workdir, preexec_fn=new_group_dying_with_parent)
            assert self.proc.stdout is not None
            up, _, _ = select.select([self.proc.stdout], [], [], max(self.timeout_s, 30.0))
            if not up or self.proc.stdout.read(1) != b"u":
                raise forkserver.ForkServerUnavailable(f"the sandbox's placeholder did not come up; "
                                                       f"log: {self.log_tail()}")
            inside = descendants(self.proc.pid)  # bubblewrap's init, then the placeholder
            if not inside:
                raise forkserver.ForkServerUnavailable("no process inside the sandbox")
            exit_r, exit_w = os.pipe()
            try:
                self.worker_pid = forkserver.server().spawn(inside[-1][0], fd, log.fileno(), exit_w, policy.env,
                                                            policy.chdir)
            except BaseException:
                os.close(exit_r)
                raise
            finally:
                os.close(exit_w)
        self._exit_r = exit_r

    def kill_sandbox(self) -> None:
        """Kill the sandbox (its bubblewrap process: the PID namespace and every process in it,
        a forked worker included) without touching the pipe."""
        if self.worker_pid is not None and self._exitcode(0) is None:  # not reaped yet: the PID is still its own
            try:
                os.kill(self.worker_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None
        self.worker_pid = None
        if self._exit_r is not None:
            os.close(self._exit_r)
            self._exit_r = None
        self._exit_status = None

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait for the spawned worker's ``ready`` (it imported the solution), at most
        ``timeout_s`` (default: the handle's timeout).

        Raises:
            WorkerFailure: import failed (``compile_error``), crash or timeout.
        """
        reply = self._recv(timeout_s or self.timeout_s, "start")
        if reply.get("kind") != "ready":
            self.kill()
            raise WorkerFailure("runtime_error", f"worker answered {reply.get('kind')!r} instead of 'ready'")
        self.process_filter = str(reply.get("process_filter") or "")
        if self.process_filter.startswith("none"):
            print(f"d2k: WARNING: the worker of {self.solution_path.name} may start processes: "
                  f"{self.process_filter}", file=sys.stderr)
        startup = reply.get("startup_s")
        self.startup_s = {k: float(v) for k, v in startup.items() if isinstance(v, (int, float))} \
            if isinstance(startup, dict) else {}

    def answered(self) -> bool:
        """True when an answer (or the end of the pipe) is waiting: :meth:`wait_ready` or the
        pending request's answer would not block. Does not read it."""
        try:
            return self.conn is None or self.conn.poll(0)
        except (EOFError, OSError):
            return True

    def request(self, msg: dict, timeout_s: float | None = None) -> dict:
        """Send one request and return the worker's answer.

        Raises:
            WorkerFailure: the worker reported an error, died, hung past the timeout or
                answered with something other than the expected record.
        """
        if self.proc is None:
            self.start()
        nonce = secrets.token_hex(16)  # the worker echoes it; solution code cannot read it (integrity.audit)
        try:
            with phase("transfer_send"):  # pickling: CUDA IPC handles / shared-memory files of the args
                self.conn.send({**msg, "nonce": nonce})
        except (BrokenPipeError, ConnectionError, OSError) as e:
            raise self._died(f"could not send {msg.get('op')!r}: {e}") from None
        reply = self._recv(timeout_s or self.timeout_s, msg.get("op", "?"))
        untrusted_op = msg.get("op") in ("call", "time") and not self.options.get("trusted")
        refused = channel.refusals_from(self.sandbox_pids()) if untrusted_op else []
        if refused and isinstance(reply, dict):
            reply["violations"] = list(reply.get("violations") or []) + [
                {"rule": "forged_answer", "evidence": e} for e in refused[:3]]
        strays = self.stray_processes() if untrusted_op else []
        if strays and isinstance(reply, dict):
            evidence = f"after {msg.get('op')!r}: {len(strays)} process(es) started by the solution still running: " + \
                "; ".join(f"pid {p}: {cmd[:80]}" for p, cmd in strays[:3]) + " (killed)"
            reply["violations"] = list(reply.get("violations") or []) + [{"rule": "child_process", "evidence": evidence}]
        want = _EXPECTED.get(msg.get("op"))
        if not isinstance(reply, dict) or reply.get("kind") != want or reply.get("nonce") != nonce:
            self.kill()
            what = f"forged answer to {msg.get('op')!r} (" + ("wrong kind" if not isinstance(reply, dict) or
                                                            reply.get("kind") != want else "missing the request's nonce")
            shown = {k: v for k, v in reply.items() if k != "nonce"} if isinstance(reply, dict) else reply
            evidence = f"{what}): {str(shown)[:200]}"
            raise WorkerFailure("integrity_violation", f"forged_answer: {evidence}",
                                [{"rule": "forged_answer", "evidence": evidence}])
        return reply

    def _recv(self, timeout_s: float, what: str) -> dict:
        try:
            ready = self.conn.poll(timeout_s)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.kill()
            raise WorkerFailure("timeout", f"no answer to {what!r} within {timeout_s:.0f} s (worker killed)")
        try:
            with phase("transfer_recv"):  # unpickling: opening the answer's CUDA IPC handles
                # an allow-list unpickler: solution code can write frames of its own on this pipe
                reply = channel.recv(self.conn, str(self.workdir) if self.workdir else None)
        except (EOFError, ConnectionError, OSError):
            raise self._died(f"worker died during {what!r}") from None
        except channel.UntrustedPickle as e:
            self.kill()
            evidence = f"an answer to {what!r} was refused while it was read: {e}"
            raise WorkerFailure("integrity_violation", f"forged_answer: {evidence}",
                                [{"rule": "forged_answer", "evidence": evidence}]) from None
        except Exception as e:  # noqa: BLE001 - an unpicklable or garbled answer
            self.kill()
            raise WorkerFailure("runtime_error", f"unreadable answer to {what!r}: {type(e).__name__}: {e}") from None
        if isinstance(reply, dict) and reply.get("kind") == "error":
            self.kill()
            raise WorkerFailure(str(reply.get("status", "runtime_error")), str(reply.get("cause", "")),
                                reply.get("violations") if isinstance(reply.get("violations"), list) else None)
        return reply

    def _exitcode(self, wait_s: float) -> int | None:
        """How the worker ended (``Popen.returncode`` convention: negative for a signal), waiting
        at most ``wait_s``; None while it runs. A forked worker's status comes from the fork
        server's child that waits for it; otherwise it is the sandbox's (bubblewrap's) own."""
        if self._exit_r is not None or self._exit_status is not None:
            if self._exit_status is None:
                ready, _, _ = select.select([self._exit_r], [], [], wait_s)
                if not ready:
                    return None
                data = os.read(self._exit_r, 64)
                try:
                    self._exit_status = os.waitstatus_to_exitcode(int(data))
                except ValueError:  # the waiting child itself was killed: the worker's sandbox is gone
                    self._exit_status = -signal.SIGKILL
            return self._exit_status
        if self.proc is None:
            return None
        try:
            return self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def _died(self, what: str) -> WorkerFailure:
        code = self._exitcode(5)
        how = f"exit code {code}" if code is not None else "still running 5 s later: killed"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        elif code is not None and code > 128 and self.sandbox.startswith("bwrap"):
            try:  # bubblewrap reports a child killed by a signal as 128 + the signal
                how = f"signal {signal.Signals(code - 128).name}"
            except ValueError:
                pass
        tail = self.log_tail()
        self.kill()
        if how == "signal SIGSYS" and self.process_filter == "seccomp":
            evidence = (f"{what}: killed by its seccomp filter (SIGSYS), which it gets for starting a process "
                        "or a program (fork, clone, exec); nothing of the solution may run unwatched")
            return WorkerFailure("integrity_violation", f"process_control: {evidence}",
                                 [{"rule": "process_control", "evidence": evidence}])
        return WorkerFailure("runtime_error", f"{what} ({how})" + (f"; log: {tail}" if tail else ""))

    def log_tail(self, n: int = 600) -> str:
        if not self.log_path:
            return ""
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        # PyTorch's profiler (the CPU backstop of every correctness call) logs its stages: not the solution's
        lines = [x for x in text.splitlines() if not x.startswith(("USDT:", "STAGE:"))]
        return "\n".join(lines)[-n:].strip()

    def sandbox_pids(self) -> list[int]:
        """Host PIDs of the worker's processes (bubblewrap, its init, the worker, its children;
        a forked worker and its children besides)."""
        if not self.alive():
            return []
        pids = [self.proc.pid] + [pid for pid, _ppid, _start in descendants(self.proc.pid)]
        if self.worker_pid is not None:
            pids += [self.worker_pid] + [pid for pid, _ppid, _start in descendants(self.worker_pid)]
        return pids

    def stray_processes(self) -> list[tuple[int, str]]:
        """Processes in the worker's sandbox other than the worker (``(pid, command line)``,
        host PIDs), killed on sight: a solution's child that outlived the call. Seen from this
        (trusted) process through ``/proc``; the sandbox's first process (bubblewrap's init, to
        which orphans are re-parented) and the worker itself are the oldest descendants. A
        forked worker's parent is outside the sandbox: the sandbox's second process is the
        placeholder, and the worker's own children are counted from the worker."""
        if not self.alive():
            return []
        tree = descendants(self.proc.pid)
        keep = 2 if self.sandbox.startswith("bwrap") else 0  # bwrap's init, then the worker (or the placeholder)
        found = tree[keep:] + (descendants(self.worker_pid) if self.worker_pid is not None else [])
        strays = [(pid, command_line(pid)) for pid, _ppid, _start in found]
        for pid, _cmd in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return strays

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return self._exit_r is None or self._exitcode(0) is None

    def kill(self) -> None:
        """End the worker and every process it started (its sandbox's PID namespace, or its
        process group where there is no sandbox)."""
        self.kill_sandbox()
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within 10 s; remove its folder."""
        if self.alive():
            try:
                self.request({"op": "exit"}, timeout_s=10)
            except WorkerFailure:
                pass
        self.kill()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> WorkerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
