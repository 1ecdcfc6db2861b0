"""Process hygiene shared by the CLI drivers and the campaign executors (Linux)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def new_group_dying_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """``preexec_fn``: start a new session (its own process group, killable as a whole) and ask
    the kernel to SIGKILL the child when the thread that started it dies, so a killed campaign
    or runner leaves no orphan agent behind."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def kill_stale_group(pid: int) -> bool:
    """SIGKILL the process group led by ``pid`` if that process is alive, leads its own session
    and is not this process. Returns True when a group was killed."""
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        if os.getsid(pid) != pid:
            return False
        os.killpg(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
