"""Enter a running bubblewrap sandbox from outside, as ``nsenter(1)`` does: join its user, mount,
network, IPC, UTS, cgroup and PID namespaces, take its root, and drop every capability.

The worker fork server (:mod:`d2kbench.harness.forkserver`) uses it so that a process that has
already imported torch and Triton can become a sandboxed worker in milliseconds instead of
starting a fresh interpreter inside the sandbox (0.07 s instead of 1.1 s per worker on an idle
2-core CI machine: ``results/cpu/sandbox/``). The sandbox itself (what is visible, what is writable) is still built by bubblewrap
for each worker from its policy; this module only moves a process into it.

Order and permissions (setns(2), user_namespaces(7), capabilities(7)): the user namespace is
joined first (the caller is single-threaded and owns it, so it gets every capability in it),
then the mount namespace, whose root the caller then takes by ``fchdir`` + ``chroot`` on a
descriptor of the target's root opened beforehand, then the other namespaces; the PID namespace
applies to the caller's children only (the caller forks the worker afterwards). Then every
capability is dropped (bounding, ambient, effective, permitted and inheritable sets) and
``no_new_privs`` is set, and the result is checked from ``/proc/self/status``: a process that
still holds a capability inside the sandbox could unmount the covers over held-back files.
Linux only.
"""

from __future__ import annotations

import ctypes
import os

#: Namespaces bubblewrap creates for a worker (``d2kbench.sandbox.bwrap.command``), in the
#: order they are joined after the user namespace; ``pid`` last (it applies to children only).
NAMESPACES = ("mnt", "net", "ipc", "uts", "cgroup", "pid")
_CLONE = {"user": 0x10000000, "mnt": 0x00020000, "net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000,
          "cgroup": 0x02000000, "pid": 0x20000000}
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_CAP_AMBIENT_IS_SET = 1
_PR_CAPBSET_READ = 23
_PR_GET_NO_NEW_PRIVS = 39
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_EINVAL = 22


class EnterFailed(OSError):
    """The sandbox could not be entered, or the process is not confined afterwards (the
    message names the step)."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, step: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise EnterFailed(err, f"{step}: {os.strerror(err)}")


def drop_capabilities() -> None:
    """Drop every capability of this process (bounding and ambient sets first, while
    ``CAP_SETPCAP`` is still held, then effective/permitted/inheritable) and set
    ``no_new_privs``, so that no later ``execve`` can regain any.

    Raises:
        EnterFailed: a step failed.
    """
    libc = _libc()
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear the ambient capabilities")
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == _EINVAL:  # past the last capability this kernel knows
                break
            _check(-1, f"drop capability {cap} from the bounding set")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # all zero: no capability in any set
    _check(libc.capset(ctypes.byref(header), data), "capset")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def confinement_problems() -> list[str]:
    """What is left of this process's privileges, asked of the kernel directly (``capget``,
    ``PR_CAPBSET_READ``, ``PR_CAP_AMBIENT_IS_SET``, ``PR_GET_NO_NEW_PRIVS``; ``/proc/self`` may
    name no process here): a capability in any set, or ``no_new_privs`` off. Empty when
    fully confined."""
    libc = _libc()
    problems = []
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        problems.append(f"capget: {os.strerror(ctypes.get_errno())}")
    else:
        for name in ("effective", "permitted", "inheritable"):
            if any(getattr(d, name) for d in data):
                problems.append(f"{name} capabilities {[getattr(d, name) for d in data]}")
    for cap in range(64):
        held = libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0)
        if held < 0:
            break  # past the last capability this kernel knows
        if held:
            problems.append(f"capability {cap} in the bounding set")
        if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1:
            problems.append(f"capability {cap} in the ambient set")
    if libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        problems.append("no_new_privs is off")
    return problems


def _ns_id(pid: int | str, name: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{name}")


def enter(target_pid: int) -> None:
    """Move this (single-threaded) process into the sandbox of ``target_pid`` (a host PID of a
    process inside it) and drop every privilege; children forked afterwards are in the
    sandbox's PID namespace too. The working directory is the sandbox's root afterwards.

    Raises:
        EnterFailed: a namespace could not be joined, the root could not be taken, or a
            capability or ``no_new_privs`` is left afterwards (the process must then exit
            without running anything else).
    """
    libc = _libc()
    fds: dict[str, int] = {}
    try:
        # every descriptor is opened before anything is joined: afterwards /proc is the sandbox's
        root = os.open(f"/proc/{target_pid}/root", os.O_RDONLY | os.O_DIRECTORY)
        fds["root"] = root
        for name in ("user", *NAMESPACES):
            if os.path.exists(f"/proc/{target_pid}/ns/{name}") and _ns_id(target_pid, name) != _ns_id("self", name):
                fds[name] = os.open(f"/proc/{target_pid}/ns/{name}", os.O_RDONLY)
        root_stat = os.fstat(root)
        for name in ("user", *NAMESPACES):
            if name in fds:
                _check(libc.setns(fds[name], _CLONE[name]), f"join the sandbox's {name} namespace")
                if name == "mnt":
                    os.fchdir(root)
                    os.chroot(".")
        here = os.stat("/")
        if (here.st_dev, here.st_ino) != (root_stat.st_dev, root_stat.st_ino):
            raise EnterFailed(_EINVAL, "the root directory is not the sandbox's root after chroot")
        for name in ("user", "mnt", "pid"):
            if name not in fds:
                raise EnterFailed(_EINVAL, f"process {target_pid} shares this process's {name} namespace: "
                                           "it is not in a sandbox")
    except OSError as e:
        if isinstance(e, EnterFailed):
            raise
        raise EnterFailed(e.errno or _EINVAL, f"enter the sandbox of process {target_pid}: {e}") from None
    finally:
        for fd in fds.values():
            os.close(fd)
    drop_capabilities()
    problems = confinement_problems()
    if problems:
        raise EnterFailed(_EINVAL, "still privileged after dropping every capability: " + "; ".join(problems))
