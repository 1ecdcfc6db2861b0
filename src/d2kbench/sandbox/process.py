"""Process hygiene shared by every launcher of child processes (Linux): workers, agent CLIs,
campaign runs.

* :func:`protect_parent`: the trusted parent is made non-dumpable, so that no process without
  ``CAP_SYS_PTRACE`` in its user namespace can attach to it or read ``/proc/<pid>/mem``
  (``prctl(PR_SET_DUMPABLE, 0)``; proc(5), ptrace(2) "Ptrace access mode checking").
* :func:`new_group_dying_with_parent`: a child in its own session that the kernel kills when
  its parent dies; :func:`unprivileged_child` also drops every capability (a worker started
  without a sandbox by a ``d2k`` that runs as root).
* :func:`kill_stale_group`: reap a process group a crashed run left behind.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def _prctl(option: int, arg: int = 0) -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def protect_parent() -> bool:
    """Make this (trusted) process non-dumpable; True when it is afterwards.

    A non-dumpable process can only be traced, and its ``/proc/<pid>/mem``, ``environ`` and
    ``fd`` entries only read, by a process with ``CAP_SYS_PTRACE`` in this process's user
    namespace: a sandboxed worker (another user namespace, no capabilities) or a worker of
    another user cannot read the expected values this process holds. Idempotent. Costs nothing
    at run time; it also disables core dumps of this process.
    """
    try:
        if _prctl(_PR_GET_DUMPABLE) != 0:
            _prctl(_PR_SET_DUMPABLE, 0)
        return _prctl(_PR_GET_DUMPABLE) == 0
    except (OSError, AttributeError):
        return False


def new_group_dying_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """``preexec_fn``: start a new session (its own process group, killable as a whole) and ask
    the kernel to SIGKILL the child when the thread that started it dies, so a killed campaign
    or runner leaves no orphan agent behind."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


def unprivileged_child() -> None:  # pragma: no cover - runs in the child before exec
    """``preexec_fn`` of a worker that runs without a sandbox: :func:`new_group_dying_with_parent`,
    and every capability dropped from the bounding and ambient sets, so that after ``exec`` the
    worker holds none, also when ``d2k`` runs as root (capabilities(7), "Transformation of
    capabilities during execve()"). Without ``CAP_SYS_PTRACE`` it cannot read the non-dumpable
    parent's memory; without ``CAP_DAC_OVERRIDE`` it cannot write files it does not own."""
    new_group_dying_with_parent()
    drop_capabilities_at_exec()


def drop_capabilities_at_exec() -> None:  # pragma: no cover - runs in the child before exec
    """``preexec_fn`` part: clear the ambient set and drop every capability from the bounding
    set, so that the program ``exec`` starts holds none, also as root."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        for cap in range(64):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: no such cap
                break
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


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(rest[1]), int(rest[19])


def descendants(pid: int) -> list[tuple[int, int, int]]:
    """``(pid, parent pid, start ticks)`` of every living descendant of ``pid``, oldest first,
    read from ``/proc`` (this process's view: PIDs of the host's namespace)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append((int(name), st[1]))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for child, start in children.get(p, []):
            out.append((child, p, start))
            todo.append(child)
    return sorted(out, key=lambda x: x[2])


def command_line(pid: int) -> str:
    """A process's command line (``?`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "?"
