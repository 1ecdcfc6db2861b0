"""A seccomp filter that forbids a process to start other processes or programs.

A process started by a solution runs without any of the worker's monitors: it can compute the
answer with PyTorch or NumPy while the worker waits and launches one do-nothing Triton kernel,
and exit before ``run`` returns, so the parent's look at the sandbox's processes after the call
(``child_process``) finds nothing (``evil/muon_newton_schulz/child_compute.py``). A CPU worker
needs no other process (the Triton interpreter compiles nothing), so before it loads anything
of the solution it installs this filter (:func:`forbid_new_processes`): ``fork``, ``vfork``,
``clone`` without ``CLONE_THREAD``, ``execve``, ``execveat`` and system calls of a foreign ABI
(x32, i386 on x86-64) kill the worker with ``SIGSYS`` (``SECCOMP_RET_KILL_PROCESS``), which
the parent sees from outside and reports as ``process_control`` (an error code could be caught
and hidden by the solution); ``clone3`` fails with ``ENOSYS`` (its flags live in memory a filter
cannot read, and glibc then creates threads with ``clone``, which stays allowed with
``CLONE_THREAD``). A filter cannot be removed, and ``PR_SET_NO_NEW_PRIVS`` is set first
(seccomp(2)). GPU workers cannot have it: Triton's
compiler runs ``ptxas`` as a process.

The program is classic BPF, assembled here (no libseccomp): seccomp(2) "Filter return values",
``struct seccomp_data`` of <linux/seccomp.h>, system call numbers of
<asm/unistd_64.h> (x86-64) and <asm-generic/unistd.h> (arm64).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# BPF opcodes (linux/bpf_common.h)
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00     # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00     # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00    # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06 | 0x00            # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

#: machine -> (AUDIT_ARCH, {name: number}) of the system calls the filter looks at.
ARCHES = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone3": 435}),
    "aarch64": (0xC00000B7, {"clone": 220, "execve": 221, "execveat": 281, "clone3": 435}),
}


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one) as ``struct sock_filter`` records.

    Raises:
        NotImplementedError: a machine not in :data:`ARCHES`.
    """
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise NotImplementedError(f"no seccomp filter for {machine} (known: {', '.join(ARCHES)})")
    audit_arch, nr = ARCHES[machine]
    deny = _RET_KILL_PROCESS
    ins: list[tuple] = [(_LD_W_ABS, "", "", 4), (_JEQ_K, "", "deny", audit_arch), (_LD_W_ABS, "", "", 0)]
    if machine == "x86_64":
        ins.append((_JGE_K, "deny", "", 0x40000000))  # x32 system calls
    ins.append((_JEQ_K, "clone", "", nr["clone"]))
    for name in ("fork", "vfork", "execve", "execveat"):
        if name in nr:
            ins.append((_JEQ_K, "deny", "", nr[name]))
    ins.append((_JEQ_K, "enosys", "", nr["clone3"]))
    ins.append((_RET_K, "", "", _RET_ALLOW))
    labels = {}
    labels["clone"] = len(ins)
    ins += [(_LD_W_ABS, "", "", 16), (_JSET_K, "", "deny", _CLONE_THREAD),  # args[0], low 32 bits
            (_RET_K, "", "", _RET_ALLOW)]
    labels["deny"] = len(ins)
    ins.append((_RET_K, "", "", deny))
    labels["enosys"] = len(ins)
    ins.append((_RET_K, "", "", _RET_ERRNO | errno.ENOSYS))
    out = b""
    for i, (code, jt, jf, k) in enumerate(ins):
        rel = [labels[j] - i - 1 if j else 0 for j in (jt, jf)]  # BPF jumps only forward
        out += struct.pack("=HBBI", code, rel[0], rel[1], k)
    return out


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def forbid_new_processes() -> str:
    """Install the filter on this process (and every thread it creates later): call while it
    has one thread. Returns ``""`` when installed, else why not (an unknown machine, a kernel
    without seccomp filters); the caller records that.
    """
    try:
        prog = program()
    except NotImplementedError as e:
        return str(e)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS): {errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}"
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}"
    return ""


def describe(device: str) -> str:
    """One line for the environment record: whether untrusted workers on ``device`` can start
    processes."""
    if device != "cpu":
        return "none (GPU workers start processes: Triton's compiler runs ptxas)"
    try:
        program()
    except NotImplementedError as e:
        return f"none ({e})"
    return "seccomp (untrusted CPU workers cannot fork, clone a process or exec)"
