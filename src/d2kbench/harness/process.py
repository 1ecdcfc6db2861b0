"""The parent's handle on one worker process: spawn, request/answer with a timeout, kill.

A hang, a crash (segfault, illegal memory access, ``os._exit``) or a forged/incomplete answer
ends the worker only; the caller gets a :class:`WorkerFailure` naming the status and cause.
"""

from __future__ import annotations

import os
import secrets
import signal
import tempfile
import time
from pathlib import Path

import torch.multiprocessing as tmp

from d2kbench.harness.phases import phase
from d2kbench.harness.worker import worker_main

#: Answer kinds a request may legitimately get back, per op.
_EXPECTED = {"call": "outputs", "time": "timing", "exit": "bye"}


class WorkerFailure(Exception):
    """The worker failed a request: ``status`` is a Status value, ``cause`` says why."""

    def __init__(self, status: str, cause: str, violations: list[dict] | None = None):
        super().__init__(f"{status}: {cause}")
        self.status = status
        self.cause = cause
        self.violations = list(violations or [])  # integrity findings ({"rule", "evidence"})


class WorkerHandle:
    """One spawned worker running one solution. Use as a context manager."""

    def __init__(self, task_root: Path, solution_path: Path, device: str, timeout_s: float,
                 options: dict | None = None):
        self.task_root = Path(task_root)
        self.solution_path = Path(solution_path)
        self.device = device
        self.timeout_s = timeout_s
        fd, self.log_path = tempfile.mkstemp(prefix="d2k-worker-", suffix=".log")
        os.close(fd)
        self.options = {**(options or {}), "log_path": self.log_path}
        self.proc = None
        self.conn = None
        self.startup_s: dict[str, float] = {}  # the worker's start-up breakdown (seconds, diagnostics)

    def start(self) -> None:
        """Spawn the worker and wait until it imported the solution.

        Raises:
            WorkerFailure: import failed (``compile_error``), crash or timeout.
        """
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the worker process without waiting for it (see :meth:`wait_ready`)."""
        ctx = tmp.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=worker_main,
            args=(child, str(self.task_root), str(self.solution_path), self.device,
                  {**self.options, "spawned_at": time.time()}),
            daemon=True,
        )
        self.proc.start()
        child.close()

    def wait_ready(self) -> None:
        """Wait for the spawned worker's ``ready`` (it imported the solution).

        Raises:
            WorkerFailure: import failed (``compile_error``), crash or timeout.
        """
        reply = self._recv(self.timeout_s, "start")
        if reply.get("kind") != "ready":
            self.kill()
            raise WorkerFailure("runtime_error", f"worker answered {reply.get('kind')!r} instead of 'ready'")
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
        want = _EXPECTED.get(msg.get("op"))
        if not isinstance(reply, dict) or reply.get("kind") != want or reply.get("nonce") != nonce:
            self.kill()
            what = f"forged answer to {msg.get('op')!r} (" + ("wrong kind" if not isinstance(reply, dict) or
                                                            reply.get("kind") != want else "missing the request's nonce")
            evidence = f"{what}): {str({k: v for k, v in reply.items() if k != 'nonce'} if isinstance(reply, dict) else reply)[:200]}"
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
                reply = self.conn.recv()
        except (EOFError, ConnectionError, OSError):
            raise self._died(f"worker died during {what!r}") from None
        except Exception as e:  # noqa: BLE001 - an unpicklable or garbled answer
            self.kill()
            raise WorkerFailure("runtime_error", f"unreadable answer to {what!r}: {type(e).__name__}: {e}") from None
        if isinstance(reply, dict) and reply.get("kind") == "error":
            self.kill()
            raise WorkerFailure(str(reply.get("status", "runtime_error")), str(reply.get("cause", "")),
                                reply.get("violations") if isinstance(reply.get("violations"), list) else None)
        return reply

    def _died(self, what: str) -> WorkerFailure:
        code = None
        if self.proc is not None:
            self.proc.join(5)
            code = self.proc.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        tail = self.log_tail()
        self.kill()
        return WorkerFailure("runtime_error", f"{what} ({how})" + (f"; log: {tail}" if tail else ""))

    def log_tail(self, n: int = 600) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within 10 s."""
        if self.proc is not None and self.proc.is_alive():
            try:
                self.request({"op": "exit"}, timeout_s=10)
            except WorkerFailure:
                pass
        self.kill()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> "WorkerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
