"""bubblewrap: find it, check once that it works here, and build its command line.

The sandbox a :class:`Policy` describes starts from an empty root: only what the policy names
is visible (read-only unless it is one of the writable paths), with new user, PID, network,
IPC, UTS and cgroup namespaces, every capability dropped, a fresh ``/proc`` (the parent's
processes are not visible, so neither is ``/proc/<ppid>/mem``), a minimal ``/dev`` plus the
device nodes named, a private ``/tmp``, a cleared environment, its own session (no access to
the controlling terminal) and ``--die-with-parent``: when the launching process dies,
however it dies, the kernel kills the sandbox's first process, and with it (it is PID 1 of
the new PID namespace) every process the untrusted code started.

Measured on the H200 machine (``devtools/sandbox_probe.py``, ``results/h200/sandbox/``): CUDA,
Triton compilation and CUDA IPC with the parent work inside such a sandbox; the extra
start-up cost of a sandboxed CUDA process is a fraction of a second.

Environment: ``D2K_BWRAP`` names the binary (default: ``bwrap`` on ``PATH``; a binary carried
next to its shared libraries finds them through ``LD_LIBRARY_PATH`` set for bwrap alone);
``D2K_SANDBOX`` is ``auto`` (default: bubblewrap if it works, else no sandbox, loudly),
``require`` (no sandbox is an error) or ``off`` (never sandbox; recorded as such).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: Values of ``D2K_SANDBOX``.
MODES = ("auto", "require", "off")


class SandboxUnavailable(RuntimeError):
    """``D2K_SANDBOX=require`` but bubblewrap is missing or cannot create namespaces here."""


@dataclass(frozen=True)
class SandboxStatus:
    """Whether untrusted code runs under bubblewrap in this process, and why not if it does not.

    ``kind`` is ``bwrap`` or ``none``; ``reason`` says why there is no sandbox (empty for bwrap).
    """

    kind: str
    binary: str | None = None
    version: str | None = None
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.kind == "bwrap"

    def describe(self) -> str:
        """One line for the environment record and the CLI."""
        if self.active:
            return f"bwrap ({self.version or 'unknown version'}; user/pid/net/ipc/uts/cgroup namespaces, no capabilities)"
        return f"none ({self.reason})"


def env_mode(name: str, modes: tuple[str, ...]) -> str:
    """The value of the environment switch ``name`` (lower-cased; ``modes[0]`` when unset or empty).

    Raises:
        ValueError: a value not in ``modes``.
    """
    value = os.environ.get(name, modes[0]).strip().lower() or modes[0]
    if value not in modes:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(modes)}")
    return value


def mode() -> str:
    """``D2K_SANDBOX`` (``auto`` when unset).

    Raises:
        ValueError: an unknown value.
    """
    return env_mode("D2K_SANDBOX", MODES)


def find_binary() -> str | None:
    """The bubblewrap binary: ``D2K_BWRAP`` if set (and executable), else ``bwrap`` on PATH."""
    named = os.environ.get("D2K_BWRAP")
    if named:
        p = Path(named).expanduser()
        return str(p.resolve()) if p.is_file() and os.access(p, os.X_OK) else None
    return shutil.which("bwrap")


def launcher_env(binary: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the bwrap process itself (not of the sandbox, which bwrap clears):
    ``base`` (default: this process's), plus the binary's own folder on ``LD_LIBRARY_PATH``
    when shared libraries were carried next to it (a device machine without bubblewrap)."""
    env = dict(os.environ if base is None else base)
    folder = Path(binary).parent
    if any(folder.glob("lib*.so*")):
        env["LD_LIBRARY_PATH"] = str(folder) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def _probe(binary: str) -> tuple[bool, str]:
    """Run ``true`` in the namespaces every policy uses; (works, bwrap's complaint)."""
    argv = [binary, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=launcher_env(binary))
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{type(e).__name__}: {e}"
    return p.returncode == 0, (p.stderr or p.stdout).strip()[-300:]


@functools.lru_cache(maxsize=1)
def _status_cached(sandbox_mode: str, binary: str | None) -> SandboxStatus:
    if sandbox_mode == "off":
        return SandboxStatus("none", reason="turned off by D2K_SANDBOX=off")
    if binary is None:
        why = (f"D2K_BWRAP={os.environ['D2K_BWRAP']!r} is not an executable file" if os.environ.get("D2K_BWRAP")
               else "bubblewrap (bwrap) is not installed: apt install bubblewrap")
        return SandboxStatus("none", reason=why)
    ok, complaint = _probe(binary)
    if not ok:
        return SandboxStatus("none", binary=binary,
                             reason=f"{binary} cannot create namespaces here: {complaint or 'no message'}")
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                                 env=launcher_env(binary)).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = None
    return SandboxStatus("bwrap", binary=binary, version=version)


_warned: set[str] = set()


def status() -> SandboxStatus:
    """The sandbox of this process (probed once per ``D2K_SANDBOX``/binary).

    Prints a warning to stderr once per process when untrusted code would run without one.

    Raises:
        SandboxUnavailable: ``D2K_SANDBOX=require`` and there is no working bubblewrap.
        ValueError: an unknown ``D2K_SANDBOX`` value.
    """
    m = mode()
    st = _status_cached(m, find_binary())
    if not st.active:
        if m == "require":
            raise SandboxUnavailable(f"D2K_SANDBOX=require but there is no sandbox: {st.reason}")
        if st.reason not in _warned:
            _warned.add(st.reason)
            print(f"d2k: WARNING: untrusted code runs WITHOUT an OS sandbox ({st.reason}); only the in-process "
                  "monitors stand between a solution and this process, its files and the network. "
                  "Results record sandbox: none.", file=sys.stderr)
    return st


@dataclass
class Policy:
    """What a sandboxed process may see and touch. Paths appear at the same place inside.

    Args:
        ro: paths bound read-only (a symbolic link is recreated as a link).
        rw: paths bound writable (the only places the process can write besides ``/tmp``,
            which is a private tmpfs, and ``dev`` nodes).
        hide: paths covered after ``ro``/``rw`` are bound: a folder by an empty tmpfs, a file by
            ``/dev/null`` (held-back files inside a visible tree).
        expose: paths bound read-only after ``hide`` (public files inside a hidden folder).
        dev: device nodes (or folders of them) bound with device access (``/dev/nvidia*``).
        env: the complete environment inside (everything else is cleared).
        chdir: the working directory inside.
        share_net: keep the network namespace (agents that talk to a model endpoint);
            default: a new one with loopback only.
    """

    ro: list[str] = field(default_factory=list)
    rw: list[str] = field(default_factory=list)
    hide: list[str] = field(default_factory=list)
    expose: list[str] = field(default_factory=list)
    dev: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    chdir: str = "/"
    share_net: bool = False


def _bind(flag: str, path: str) -> list[str]:
    p = Path(path)
    if p.is_symlink():
        return ["--symlink", os.readlink(p), str(p)]
    return [flag, str(p), str(p)]


def command(binary: str, policy: Policy, argv: list[str]) -> list[str]:
    """The bwrap command line that runs ``argv`` under ``policy``.

    Raises:
        FileNotFoundError: a path of ``ro``, ``rw``, ``expose`` or ``dev`` does not exist.
    """
    for group in (policy.ro, policy.rw, policy.expose, policy.dev):
        for p in group:
            if not os.path.lexists(p):
                raise FileNotFoundError(f"sandbox policy names {p}, which does not exist")
    out = [binary, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if not policy.share_net:
        out.append("--unshare-net")
    out += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for p in policy.ro:
        out += _bind("--ro-bind", p)
    for p in policy.rw:
        out += _bind("--bind", p)
    for p in policy.hide:
        if os.path.isdir(p):
            out += ["--tmpfs", p]
        elif os.path.lexists(p):
            out += ["--ro-bind", "/dev/null", p]
    for p in policy.expose:
        out += _bind("--ro-bind", p)
    for p in policy.dev:
        out += ["--dev-bind", p, p]
    out += ["--clearenv"]
    for k, v in sorted(policy.env.items()):
        out += ["--setenv", k, v]
    out += ["--chdir", policy.chdir, "--", *argv]
    return out


def wrap(argv: list[str], policy: Policy, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``(command, launcher environment)`` that run ``argv`` under ``policy`` when there is a
    sandbox (:func:`status`), else ``argv`` itself with ``policy.env`` (and a loud warning once).

    Raises:
        SandboxUnavailable: ``D2K_SANDBOX=require`` without a sandbox.
    """
    st = status()
    if st.active:
        if st.binary is None:
            raise SandboxUnavailable("the sandbox is active but names no bwrap binary")
        return command(st.binary, policy, argv), launcher_env(st.binary, env)
    return list(argv), dict(policy.env)
