"""A PEP 578 audit hook for the worker: records, and blocks, what solution code must not do.

``sys.addaudithook`` hooks cannot be removed from Python, and CPython raises an audit event for
the operations a cheat needs: frame and garbage-collector access (``sys._getframe``,
``tb_frame``, ``gc.get_objects``), tracing hooks, ctypes (``dlopen``/``dlsym``/foreign calls),
processes and signals, and file writes. While *armed* (the solution's import, its calls and the
timing loop), the hook attributes each such event to the code that caused it by walking the
Python stack past the standard library: the event is the solution's when the first frame outside
the standard library belongs to the solution (its file, its folder, or code compiled from a
string). Those events are recorded as ``(rule, evidence)`` and the operation is refused with a
:class:`PermissionError`. Writes to protected folders (the harness package, the task folder,
installed packages) are refused whoever asks, except byte-code caches written by the import
system.

The hook keeps its state in a closure, not in module globals, so a solution that imports this
module finds nothing to switch off; reaching the closure needs the very introspection the hook
blocks.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import threading

#: Event -> rule, for events that are the solution's when it caused them.
ATTRIBUTED = {
    "sys._getframe": "introspection", "sys._current_frames": "introspection",
    "sys._getframemodulename": "introspection", "gc.get_objects": "introspection",
    "gc.get_referrers": "introspection", "gc.get_referents": "introspection",
    "sys.settrace": "introspection", "sys.setprofile": "introspection", "sys.addaudithook": "introspection",
    "sys.monitoring.register_callback": "introspection", "sys._setprofileallthreads": "introspection",
    "sys._settraceallthreads": "introspection",
    "os.system": "process_control", "os.exec": "process_control", "os.posix_spawn": "process_control",
    "os.spawn": "process_control", "os.fork": "process_control", "os.forkpty": "process_control",
    "os.kill": "process_control", "os.killpg": "process_control", "signal.pthread_kill": "process_control",
    "subprocess.Popen": "process_control", "pty.spawn": "process_control", "os.startfile": "process_control",
}
#: ``object.__getattr__`` / ``__setattr__`` attribute names that expose frames or swap code.
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
CODE_ATTRS = {"__code__", "__globals__", "__closure__", "__defaults__", "__kwdefaults__"}
#: Standard-library modules that read the caller's frame on the caller's behalf without handing
#: it out (``namedtuple``, ``Enum``, ``typing`` use ``sys._getframe(1)`` for ``__module__``).
SAFE_FRAME_CALLERS = ("collections/__init__.py", "/enum.py", "/typing.py", "/dataclasses.py", "/warnings.py",
                      "/abc.py", "/functools.py")
#: Imports that are the solution's when it caused them (prefix match).
FORBIDDEN_IMPORTS = ("cupy", "cupyx", "pycuda", "numba", "cuda", "nvmath", "tilelang", "cutlass", "flashinfer",
                     "flash_attn", "xformers", "vllm", "sgl_kernel", "deep_gemm", "transformer_engine",
                     "liger_kernel", "bitsandbytes", "torchao", "triton_kernels", "torch.utils.cpp_extension",
                     "torch._inductor", "torch._dynamo", "cffi", "apex")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_PATH_EVENTS = {"os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.truncate": (0,), "os.chmod": (0,),
                "os.chown": (0,), "os.link": (0, 1), "os.symlink": (0, 1), "os.utime": (0,), "os.mkdir": (0,),
                "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.copyfile": (1,), "shutil.copytree": (1,),
                "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}


def _stdlib_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    paths = sysconfig.get_paths()
    std = tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k)})
    sites = set()
    for s in [*getattr(site, "getsitepackages", lambda: [])(), paths.get("purelib"), paths.get("platlib")]:
        if s:
            sites.add(os.path.realpath(s) + os.sep)
    return std, tuple(sites)


def solution_scope(solution_path: str) -> tuple[str, str, tuple[str, ...]]:
    """``(file, folder, excluded)`` that decide which code is the solution's: the solution file,
    and other files in its folder except those inside installed libraries (site-packages) or the
    d2kbench package, unless the solution itself lives there. A solution kept in a project root
    next to a virtual environment (``./.venv``) or the harness's sources (``./src``) must not
    make PyTorch or the harness count as solution code."""
    sol_file = os.path.realpath(solution_path)
    sol_dir = os.path.dirname(sol_file) + os.sep
    _, site_dirs = _stdlib_dirs()
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # .../d2kbench/
    excluded = tuple(d for d in (*site_dirs, package) if not sol_file.startswith(d))
    return sol_file, sol_dir, excluded


def is_solution_file(fn: str, scope: tuple[str, str, tuple[str, ...]]) -> bool:
    """Whether code from file ``fn`` is the solution's under ``scope`` (:func:`solution_scope`)."""
    sol_file, sol_dir, excluded = scope
    return fn == sol_file or (fn.startswith(sol_dir) and not fn.startswith(excluded))


class AuditRecorder:
    """The worker's handle on the installed hook: arm/disarm it, record, and drain findings."""

    def __init__(self, arm, disarm, drain, record, armed):
        self.arm = arm
        self.disarm = disarm
        self.drain = drain
        self.record = record
        self.armed = armed


def install(solution_path: str, protected: list[str]) -> AuditRecorder:
    """Install the audit hook (once per process) and return its recorder.

    Args:
        solution_path: the solution file; code in its folder (and code compiled from strings)
            counts as the solution's.
        protected: folders nobody may write into while armed (harness, task, site-packages).
    """
    std_dirs, site_dirs = _stdlib_dirs()
    scope = solution_scope(solution_path)
    own_file = os.path.realpath(__file__)
    protected_dirs = tuple(sorted({os.path.realpath(p).rstrip(os.sep) + os.sep for p in protected}))
    state = {"armed": False}
    found: list[tuple[str, str]] = []
    local = threading.local()
    getframe = sys._getframe
    realpath = os.path.realpath

    def is_stdlib(fn: str) -> bool:
        if fn.startswith("<frozen"):
            return True
        return fn.startswith(std_dirs) and not fn.startswith(site_dirs)

    def owner(frame) -> tuple[str, int] | None:
        """(file, line) of the solution frame that caused the event, or None if not the solution's."""
        f = frame
        while f is not None:
            fn = f.f_code.co_filename
            if fn == own_file or is_stdlib(fn):
                f = f.f_back
                continue
            if is_solution_file(fn, scope) or (fn.startswith("<") and not fn.startswith("<frozen")):
                return fn, f.f_lineno
            return None
        return None

    def where(o: tuple[str, int]) -> str:
        return f"{os.path.basename(o[0])}:{o[1]}"

    def protected_path(p) -> str | None:
        if isinstance(p, int) or p is None:
            return None
        try:
            path = realpath(os.fsdecode(p))
        except (TypeError, ValueError):
            return None
        return path if path.startswith(protected_dirs) or path.rstrip(os.sep) + os.sep in protected_dirs else None

    def refuse(rule: str, evidence: str, block: bool = True) -> None:
        found.append((rule, evidence))
        if block:
            raise PermissionError(f"d2k integrity: {evidence} is not allowed in a solution")

    def hook(event: str, args: tuple) -> None:
        if not state["armed"] or getattr(local, "busy", False):
            return
        rule = ATTRIBUTED.get(event)
        if rule is None:  # cheap filters first: this hook sees every audit event of the process
            if event == "object.__getattr__":
                if len(args) < 2 or args[1] not in FRAME_ATTRS:
                    return
            elif event in ("object.__setattr__", "object.__delattr__"):
                if len(args) < 2 or args[1] not in CODE_ATTRS:
                    return
            elif event == "open":
                if len(args) < 3 or not ((isinstance(args[2], int) and args[2] & _WRITE_FLAGS) or
                                         (isinstance(args[1], str) and any(c in args[1] for c in "wax+"))):
                    return
            elif not (event == "import" or event.startswith("ctypes.") or event in _PATH_EVENTS):
                return
        local.busy = True
        try:
            caller = getframe(1)
            if rule:
                if event == "os.kill" and args and args[0] == os.getpid():
                    return  # signalling itself ends the worker: a crash, reported as such
                if rule == "introspection" and event.startswith(("sys._getframe", "sys._current")) and \
                        caller is not None and caller.f_code.co_filename.endswith(SAFE_FRAME_CALLERS):
                    return
                o = owner(caller)
                if o:
                    refuse(rule, f"{event} from {where(o)}")
            elif event.startswith("ctypes."):
                o = owner(caller)
                if o:
                    refuse("ctypes", f"{event} {str(args[:2])[:80]} from {where(o)}")
            elif event == "object.__getattr__":
                if len(args) > 1 and args[1] in FRAME_ATTRS:
                    o = owner(caller)
                    if o:
                        refuse("introspection", f"access to .{args[1]} from {where(o)}")
            elif event in ("object.__setattr__", "object.__delattr__"):
                if len(args) > 1 and args[1] in CODE_ATTRS:
                    o = owner(caller)
                    if o:
                        refuse("monkeypatch", f"{event} {type(args[0]).__name__}.{args[1]} from {where(o)}")
            elif event == "import":
                name = str(args[0]) if args else ""
                if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_IMPORTS):
                    o = owner(caller)
                    if o:
                        refuse("forbidden_library", f"import {name} from {where(o)}")
            elif event == "open":
                path, mode, flags = (list(args) + [None, None, None])[:3]
                writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or \
                    (isinstance(mode, str) and any(c in mode for c in "wax+"))
                if writing and (p := protected_path(path)):
                    o = owner(caller)
                    if o or not p.endswith(".pyc"):
                        refuse("harness_tampering", f"open({p!r}, {mode or flags!r}) for writing"
                               + (f" from {where(o)}" if o else ""))
            else:  # rename, remove, chmod, ... of protected paths
                for i in _PATH_EVENTS[event]:
                    if i < len(args) and (p := protected_path(args[i])):
                        o = owner(caller)
                        if o or not p.endswith(".pyc"):
                            refuse("harness_tampering", f"{event}({p!r})" + (f" from {where(o)}" if o else ""))
        finally:
            local.busy = False

    def arm() -> None:
        state["armed"] = True

    def disarm() -> None:
        state["armed"] = False

    def drain() -> list[tuple[str, str]]:
        out = list(found)
        del found[:]
        return out

    def record(rule: str, evidence: str) -> None:
        found.append((rule, evidence))

    def armed() -> bool:
        return state["armed"]

    sys.addaudithook(hook)
    return AuditRecorder(arm, disarm, drain, record, armed)


def solution_caller(solution_path: str, depth: int = 2) -> str | None:
    """``file:line`` of the code that called the function ``depth - 1`` frames up, when that code
    is the solution's (the first frame outside the standard library is in the solution's folder
    or was compiled from a string); None when the harness, PyTorch or another library called."""
    std_dirs, site_dirs = _stdlib_dirs()
    scope = solution_scope(solution_path)
    f = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith("<frozen") or (fn.startswith(std_dirs) and not fn.startswith(site_dirs)):
            f = f.f_back
            continue
        if is_solution_file(fn, scope) or fn.startswith("<"):
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        return None
    return None

