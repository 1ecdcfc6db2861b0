"""A PEP 578 audit hook for the worker: records, and blocks, what solution code must not do.

``sys.addaudithook`` hooks cannot be removed from Python, and CPython raises an audit event for
the operations a cheat needs: frame and garbage-collector access (``sys._getframe``,
``tb_frame``, ``gc.get_objects``), tracing hooks, ctypes (``dlopen``/``dlsym``/foreign calls),
processes and signals, and file writes. While *armed* (the solution's import, its calls and the
timing loop), the hook attributes each such event to the code that caused it by walking the
Python stack past the standard library: the event is the solution's when the first frame outside
the standard library belongs to the solution (its file, its folder, or code compiled from a
string, or any code object the solution created at run time, whatever file it names). Those
events are recorded as ``(rule, evidence)`` and the operation is refused with a
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
from collections.abc import Callable
from types import FrameType
from typing import Any, NamedTuple

# Imports inside functions: ctypes, marshal and importlib.util load only when the hook is
# installed (it keeps ctypes' originals as they are then) or meets the event that needs them.

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
#: Library functions that call ctypes on their own behalf, whoever calls them: (file suffix,
#: function). PyTorch counts devices through NVML (``dlopen('libnvidia-ml.so.1')``, ``nvmlInit``,
#: ``nvmlDeviceGetCount``/UUIDs) before CUDA is initialised, so a solution's first Triton launch or
#: ``torch.cuda`` call reaches it (seen on the H200: every fused_moe_fp8_block expert call
#: refused as ``ctypes`` at its first launch). They load that one library and read device counts.
#: They are recognised by the identity of their code objects, taken when the hook is installed
#: (code compiled at run time can carry any file and function name), and inside them only NVML
#: is reachable: ``NVML_LIBRARY`` loaded by name, ``NVML_SYMBOLS`` looked up and called.
SAFE_CTYPES_CALLERS = (("torch/cuda/__init__.py", "_raw_device_count_nvml"),
                       ("torch/cuda/__init__.py", "_raw_device_uuid_nvml"))
NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_SYMBOLS = frozenset({"nvmlInit", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID"})
#: Audit events that create code objects with a file name of the caller's choosing (compiled
#: source, ``CodeType``/``code.replace``, unmarshalled byte code): frames of such code are the
#: solution's whatever file they name, when the solution created them.
_CODE_EVENTS = ("compile", "code.__new__", "marshal.loads")
#: Imports that are the solution's when it caused them (prefix match).
FORBIDDEN_IMPORTS = ("cupy", "cupyx", "pycuda", "numba", "cuda", "nvmath", "tilelang", "cutlass", "flashinfer",
                     "flash_attn", "xformers", "vllm", "sgl_kernel", "deep_gemm", "transformer_engine",
                     "liger_kernel", "bitsandbytes", "torchao", "triton_kernels", "torch.utils.cpp_extension",
                     "torch._inductor", "torch._dynamo", "cffi", "apex")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def proc_memory_file(path) -> str | None:
    """The process memory file (``/proc/<pid>/mem``, ``/proc/self/task/<tid>/mem``, ...) that
    opening ``path`` would reach, or None. A relative path whose last component is ``mem``
    counts too: ``os.open("mem", dir_fd=<fd of /proc/self>)`` shows the hook only the name."""
    if isinstance(path, int) or path is None:
        return None
    try:
        p = os.fsdecode(path)
    except (TypeError, ValueError):
        return None
    if not os.path.isabs(p) and os.path.basename(p.rstrip("/")) == "mem":
        return p
    real = os.path.realpath(p)
    parts = real.split("/")
    if len(parts) >= 4 and parts[1] == "proc" and parts[-1] == "mem" and (parts[2].isdigit() or
                                                                         parts[2] in ("self", "thread-self")):
        return real
    return None


def symlink_into_proc(target, link) -> bool:
    """Whether a symbolic link ``link`` -> ``target`` could lead into ``/proc`` (a relative target
    counts: the folder a ``dir_fd`` names is not in the audit event)."""
    try:
        t = os.fsdecode(target)
    except (TypeError, ValueError):
        return False
    if not os.path.isabs(t):
        return True
    return os.path.realpath(t).startswith("/proc/") or os.path.realpath(t) == "/proc"


_PATH_EVENTS = {"os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.truncate": (0,), "os.chmod": (0,),
                "os.chown": (0,), "os.link": (0, 1), "os.symlink": (0, 1), "os.utime": (0,), "os.mkdir": (0,),
                "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.copyfile": (1,), "shutil.copytree": (1,),
                "os.chflags": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}


def _safe_ctypes_codes() -> tuple[tuple, dict | None]:
    """The code objects of the ``SAFE_CTYPES_CALLERS`` functions and their module's globals as
    they are now (the worker imports torch before the hook is installed), or none where torch is
    not loaded."""
    codes = []
    mod = sys.modules.get("torch.cuda")
    for suffix, name in SAFE_CTYPES_CALLERS:
        code = getattr(getattr(mod, name, None), "__code__", None)
        if code is not None and code.co_filename.endswith(suffix) and code.co_name == name:
            codes.append(code)
    return tuple(codes), (vars(mod) if codes else None)


#: What the ``SAFE_CTYPES_CALLERS`` take from ctypes; with these swapped (a poisoned ``ctypes``
#: module or ``__import__``), they would hand the solution's pointers to NVML.
_NVML_CTYPES_NAMES = ("CDLL", "byref", "c_int", "c_void_p", "create_string_buffer")


def _nvml_addresses() -> frozenset[int]:
    """Addresses of ``NVML_SYMBOLS`` in the loaded NVML library (empty when it is not loaded):
    the only foreign functions a ``SAFE_CTYPES_CALLERS`` frame may call."""
    import _ctypes

    try:
        handle = _ctypes.dlopen(NVML_LIBRARY, os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return frozenset()
    out = set()
    for name in NVML_SYMBOLS:
        try:
            out.add(int(_ctypes.dlsym(handle, name)))
        except OSError:
            pass
    return frozenset(out)


def _code_filenames(code) -> set[str]:
    """``co_filename`` of ``code`` and of every code object nested in its constants."""
    out, todo = set(), [code]
    while todo:
        c = todo.pop()
        out.add(c.co_filename)
        todo += [k for k in c.co_consts if hasattr(k, "co_filename")]
    return out


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

    The hook's state (armed or not, findings, files adopted as the solution's) lives in the
    closures built here and by the builders below, not in module globals.

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
    trusted_dirs = tuple({*std_dirs, *site_dirs, os.path.dirname(os.path.dirname(own_file)) + os.sep})
    adopted: set[str] = set()  # files named by code the solution created at run time

    def refuse(rule: str, evidence: str, block: bool = True) -> None:
        found.append((rule, evidence))
        if block:
            raise PermissionError(f"d2k integrity: {evidence} is not allowed in a solution")

    is_stdlib, owner, involved = _frame_attribution(scope, own_file, std_dirs, site_dirs, adopted)
    protected_path = _protected_path_check(protected_dirs)
    judges = _Judges(
        attributed=_attributed_judge(is_stdlib, owner, refuse),
        ctypes=_ctypes_judge(_library_ctypes_check(own_file, is_stdlib), owner, involved, refuse),
        code=_code_adopter(scope, trusted_dirs, adopted, owner, involved),
        frame_access=_frame_access_judge(owner, refuse),
        code_swap=_code_swap_judge(owner, refuse),
        imports=_import_judge(owner, refuse),
        open=_open_judge(protected_path, owner, involved, refuse),
        path=_path_judge(protected_path, owner, involved, refuse),
    )
    hook = _audit_hook(state, judges)

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


# The builders below run once, inside install(); each returns the closures that the installed
# hook keeps (a builder replaced after install() changes nothing). The closures reach one another
# through their cells; like the hook before it was split, they read the rule tables (ATTRIBUTED,
# FORBIDDEN_IMPORTS, ...) and the plain path helpers (proc_memory_file, ...) from the module.

Frame = Any  # a frame object (types.FrameType), or None past the bottom of the stack
Owner = Callable[[Frame], "tuple[str, int] | None"]
Refuse = Callable[..., None]


class _Judges(NamedTuple):
    """One judge per family of audit events, in the order :func:`_audit_hook` unpacks them. Each
    takes the event's arguments and the frame that raised it, and records and refuses through
    ``refuse`` when the solution did what its family forbids."""

    attributed: Callable[[str, str, tuple, Frame], None]  # ATTRIBUTED: introspection, processes
    ctypes: Callable[[str, tuple, Frame], None]  # ctypes.*: foreign code
    code: Callable[[str, tuple, Frame], None]  # _CODE_EVENTS: code created at run time
    frame_access: Callable[[tuple, Frame], None]  # object.__getattr__ of FRAME_ATTRS
    code_swap: Callable[[str, tuple, Frame], None]  # object.__setattr__/__delattr__ of CODE_ATTRS
    imports: Callable[[tuple, Frame], None]  # import of FORBIDDEN_IMPORTS
    open: Callable[[tuple, Frame], None]  # open: process memory files, protected writes
    path: Callable[[str, tuple, Frame], None]  # _PATH_EVENTS: links, renames, removals, ...


def _worth_judging(event: str, args: tuple) -> bool:
    """Whether an event that is not in ``ATTRIBUTED`` can concern a rule at all: the cheap filter
    the hook runs first, since it sees every audit event of the process. Reading a frame
    attribute, setting or deleting a code attribute, opening a process's memory file or any file
    for writing, an import, ctypes, a path event, or code created under a file name (code named
    ``"<string>"`` and the like is the solution's already and needs no adopting)."""
    if event == "object.__getattr__":
        return len(args) >= 2 and args[1] in FRAME_ATTRS
    if event in ("object.__setattr__", "object.__delattr__"):
        return len(args) >= 2 and args[1] in CODE_ATTRS
    if event == "open":
        if args and isinstance(args[0], (str, bytes, os.PathLike)) and proc_memory_file(args[0]):
            return True  # reading or writing a process's memory: judged whoever asks
        return len(args) >= 3 and bool((isinstance(args[2], int) and args[2] & _WRITE_FLAGS) or
                                       (isinstance(args[1], str) and any(c in args[1] for c in "wax+")))
    if not (event == "import" or event.startswith("ctypes.") or event in _PATH_EVENTS or event in _CODE_EVENTS):
        return False
    return not (event in _CODE_EVENTS and args and len(args) > 1 and isinstance(args[1], str) and
                args[1].startswith("<") and not args[1].startswith("<frozen"))


def _where(o: tuple[str, int]) -> str:
    """``file:line`` of an ``(file, line)`` owner, as the evidence of a refusal names it."""
    return f"{os.path.basename(o[0])}:{o[1]}"


def _audit_hook(state: dict[str, bool], judges: _Judges) -> Callable[[str, tuple], None]:
    """The hook itself: while armed, filter the event cheaply, then hand it with the frame that
    raised it to the judge of its family. A thread already inside the hook is not judged again
    (the judges' own file reads and imports raise audit events too)."""
    local = threading.local()
    getframe = sys._getframe
    worth_judging = _worth_judging
    on_attributed, on_ctypes, on_code, on_frame_access, on_code_swap, on_import, on_open, on_path = judges

    def hook(event: str, args: tuple) -> None:
        if not state["armed"] or getattr(local, "busy", False):
            return
        rule = ATTRIBUTED.get(event)
        if rule is None and not worth_judging(event, args):
            return
        local.busy = True
        try:
            caller = getframe(1)
            if rule:
                on_attributed(event, rule, args, caller)
            elif event.startswith("ctypes."):
                on_ctypes(event, args, caller)
            elif event in _CODE_EVENTS:
                on_code(event, args, caller)
            elif event == "object.__getattr__":
                on_frame_access(args, caller)
            elif event in ("object.__setattr__", "object.__delattr__"):
                on_code_swap(event, args, caller)
            elif event == "import":
                on_import(args, caller)
            elif event == "open":
                on_open(args, caller)
            else:  # os.symlink, rename, remove, chmod, ... (_PATH_EVENTS)
                on_path(event, args, caller)
        finally:
            local.busy = False

    return hook


def _frame_attribution(scope: tuple[str, str, tuple[str, ...]], own_file: str, std_dirs: tuple[str, ...],
                       site_dirs: tuple[str, ...], adopted: set[str]) -> tuple[Callable[[str], bool], Owner, Owner]:
    """``(is_stdlib, owner, involved)``: whether a file is the standard library's (files the
    solution's run-time code named, ``adopted``, are not), the solution frame that caused an
    event (the first frame outside this file and the standard library, when it is the
    solution's), and the innermost solution frame anywhere on the stack. Both give
    ``(file, line)`` or None."""

    def is_stdlib(fn: str) -> bool:
        if fn.startswith("<frozen"):
            return True
        return fn.startswith(std_dirs) and not fn.startswith(site_dirs) and fn not in adopted

    def solution_file(fn: str) -> bool:
        return fn in adopted or is_solution_file(fn, scope) or (fn.startswith("<") and not fn.startswith("<frozen"))

    def owner(frame: Frame) -> tuple[str, int] | None:
        """(file, line) of the solution frame that caused the event, or None if not the solution's."""
        f = frame
        while f is not None:
            fn = f.f_code.co_filename
            if fn == own_file or is_stdlib(fn):
                f = f.f_back
                continue
            if solution_file(fn):
                return fn, f.f_lineno
            return None
        return None

    def involved(frame: Frame) -> tuple[str, int] | None:
        """(file, line) of the innermost solution frame anywhere on the stack, or None."""
        f = frame
        while f is not None:
            fn = f.f_code.co_filename
            if fn != own_file and not is_stdlib(fn) and solution_file(fn):
                return fn, f.f_lineno
            f = f.f_back
        return None

    return is_stdlib, owner, involved


def _attributed_judge(is_stdlib: Callable[[str], bool], owner: Owner,
                      refuse: Refuse) -> Callable[[str, str, tuple, Frame], None]:
    """Judge of the ``ATTRIBUTED`` events (rules ``introspection`` and ``process_control``): the
    solution's when it caused them. A process signalling itself is let through (it ends the
    worker: a crash, reported as such), and so is a ``SAFE_FRAME_CALLERS`` module reading its
    caller's frame."""
    where = _where

    def judge(event: str, rule: str, args: tuple, caller: Frame) -> None:
        if event == "os.kill" and args and args[0] == os.getpid():
            return  # signalling itself ends the worker: a crash, reported as such
        if rule == "introspection" and event.startswith(("sys._getframe", "sys._current")) and \
                caller is not None and caller.f_code.co_filename.endswith(SAFE_FRAME_CALLERS) and \
                is_stdlib(caller.f_code.co_filename) and not caller.f_code.co_filename.startswith("<"):
            return
        o = owner(caller)
        if o:
            refuse(rule, f"{event} from {where(o)}")

    return judge


def _library_ctypes_check(own_file: str, is_stdlib: Callable[[str], bool]) -> Callable[[Frame, str, tuple], bool]:
    """Whether a ctypes event is a ``SAFE_CTYPES_CALLERS`` function reaching NVML only. Takes
    ctypes' originals and the callers' code objects as they are now (at install time)."""
    safe_codes, safe_globals = _safe_ctypes_codes()
    nvml_calls: list[frozenset[int]] = []  # looked up once NVML is loaded
    import builtins
    import ctypes
    genuine_cdll = ctypes.CDLL
    genuine_import = builtins.__import__
    genuine_ctypes = {n: getattr(ctypes, n) for n in _NVML_CTYPES_NAMES}

    def library_ctypes(frame: Frame, event: str, args: tuple) -> bool:
        """Whether the first frame outside the standard library runs the code of a
        ``SAFE_CTYPES_CALLERS`` function (the very code object) and the event reaches NVML only:
        ``NVML_LIBRARY`` loaded by name, an ``NVML_SYMBOLS`` symbol looked up in a plain ``CDLL``
        of it, a call of one of those symbols, a string buffer made."""
        f = frame
        while f is not None and (f.f_code.co_filename == own_file or is_stdlib(f.f_code.co_filename)):
            f = f.f_back
        if f is None or not any(f.f_code is c for c in safe_codes) or f.f_globals is not safe_globals:
            return False
        lib = sys.modules.get("ctypes")
        if builtins.__import__ is not genuine_import or lib is not ctypes or \
                any(vars(ctypes).get(n) is not v for n, v in genuine_ctypes.items()):
            return False
        if event == "ctypes.dlopen":
            return len(args) > 0 and type(args[0]) is str and args[0] == NVML_LIBRARY
        if event == "ctypes.dlsym":
            lib = args[0] if args else None
            return (len(args) > 1 and type(lib) is genuine_cdll and type(args[1]) is str and args[1] in NVML_SYMBOLS
                    and vars(lib).get("_name") == NVML_LIBRARY)
        if event == "ctypes.call_function":
            if not nvml_calls or not nvml_calls[-1]:
                nvml_calls.append(_nvml_addresses())
            return len(args) > 0 and isinstance(args[0], int) and args[0] in nvml_calls[-1]
        return event == "ctypes.create_string_buffer"

    return library_ctypes


def _ctypes_judge(library_ctypes: Callable[[Frame, str, tuple], bool], owner: Owner, involved: Owner,
                  refuse: Refuse) -> Callable[[str, tuple, Frame], None]:
    """Judge of ``ctypes.*`` events (rule ``ctypes``): the solution anywhere on the stack is
    enough, unless a ``SAFE_CTYPES_CALLERS`` function reaches NVML only."""
    where = _where

    def judge(event: str, args: tuple, caller: Frame) -> None:
        # the solution anywhere on the stack is enough: a library function handed
        # ctypes.string_at (or a foreign function) must not launder the call. Neither
        # Triton (CPU interpreter, NVIDIA backend) nor PyTorch's tensor API calls ctypes;
        # PyTorch's NVML device count does (SAFE_CTYPES_CALLERS).
        o = owner(caller) or involved(caller)
        if o and not library_ctypes(caller, event, args):
            refuse("ctypes", f"{event} {str(args[:2])[:80]} from {where(o)}")

    return judge


def _code_adopter(scope: tuple[str, str, tuple[str, ...]], trusted_dirs: tuple[str, ...], adopted: set[str],
                  owner: Owner, involved: Owner) -> Callable[[str, tuple, Frame], None]:
    """Judge of ``_CODE_EVENTS``: refuses nothing, but adds to ``adopted`` the files that code
    created by the solution names, so that frames of that code count as the solution's."""

    def genuine(fn: str, event: str, data: Any) -> bool:
        """Whether code named ``fn`` is what an installed library's file holds: its source
        (``compile``) or the byte code of its cache (``marshal.loads``), in a trusted folder."""
        if not fn.startswith(trusted_dirs) or event == "code.__new__":
            return False
        try:
            if event == "compile":
                with open(fn, "rb") as fh:
                    disk = fh.read()
                return isinstance(data, (bytes, str)) and disk == (data.encode() if isinstance(data, str) else data)
            import importlib.util
            with open(importlib.util.cache_from_source(fn), "rb") as fh:
                return fh.read()[16:] == bytes(data)
        except (OSError, ValueError, TypeError, NotImplementedError):
            return False

    def adopt(event: str, args: tuple, caller: Frame) -> None:
        """Record the files that code created by the solution claims (``_CODE_EVENTS``): any file
        when the solution asked (through the standard library), and files outside the installed
        libraries when it is anywhere on the stack (``compile`` handed to a library's
        higher-order function; a library compiling its own files while the solution runs, as
        Triton's interpreter does, stays the library's)."""
        if not args:
            return
        direct = owner(caller) is not None
        if not direct and involved(caller) is None:
            return
        if event == "marshal.loads":
            import marshal
            try:
                names = _code_filenames(marshal.loads(args[0]))
            except (ValueError, EOFError, TypeError):  # not valid byte code: nothing to adopt
                return
        else:
            names = {args[1]} if len(args) > 1 and isinstance(args[1], str) else set()
        for fn in names:
            if fn in adopted or (fn.startswith("<") and not fn.startswith("<frozen")) or is_solution_file(fn, scope):
                continue
            if not genuine(fn, event, args[0]) and (direct or not fn.startswith(trusted_dirs)):
                adopted.add(fn)

    return adopt


def _frame_access_judge(owner: Owner, refuse: Refuse) -> Callable[[tuple, Frame], None]:
    """Judge of ``object.__getattr__`` (rule ``introspection``): the solution reading an
    attribute that hands out a frame (``FRAME_ATTRS``)."""
    where = _where

    def judge(args: tuple, caller: Frame) -> None:
        if len(args) > 1 and args[1] in FRAME_ATTRS:
            o = owner(caller)
            if o:
                refuse("introspection", f"access to .{args[1]} from {where(o)}")

    return judge


def _code_swap_judge(owner: Owner, refuse: Refuse) -> Callable[[str, tuple, Frame], None]:
    """Judge of ``object.__setattr__``/``__delattr__`` (rule ``monkeypatch``): the solution
    setting or deleting a function's code, globals, closure or defaults (``CODE_ATTRS``)."""
    where = _where

    def judge(event: str, args: tuple, caller: Frame) -> None:
        if len(args) > 1 and args[1] in CODE_ATTRS:
            o = owner(caller)
            if o:
                refuse("monkeypatch", f"{event} {type(args[0]).__name__}.{args[1]} from {where(o)}")

    return judge


def _import_judge(owner: Owner, refuse: Refuse) -> Callable[[tuple, Frame], None]:
    """Judge of ``import`` (rule ``forbidden_library``): the solution importing a module of
    ``FORBIDDEN_IMPORTS`` or one inside it."""
    where = _where

    def judge(args: tuple, caller: Frame) -> None:
        name = str(args[0]) if args else ""
        if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_IMPORTS):
            o = owner(caller)
            if o:
                refuse("forbidden_library", f"import {name} from {where(o)}")

    return judge


def _protected_path_check(protected_dirs: tuple[str, ...]) -> Callable[[Any], str | None]:
    """The resolved path when a path argument names a protected folder or a file inside one,
    else None (file descriptors and undecodable paths: None)."""
    realpath = os.path.realpath

    def protected_path(p: Any) -> str | None:
        if isinstance(p, int) or p is None:
            return None
        try:
            path = realpath(os.fsdecode(p))
        except (TypeError, ValueError):
            return None
        return path if path.startswith(protected_dirs) or path.rstrip(os.sep) + os.sep in protected_dirs else None

    return protected_path


def _open_judge(protected_path: Callable[[Any], str | None], owner: Owner, involved: Owner,
                refuse: Refuse) -> Callable[[tuple, Frame], None]:
    """Judge of ``open``: a process's memory file opened while the solution runs (rule
    ``host_compute``, the solution anywhere on the stack or not at all), and a protected file
    opened for writing (rule ``harness_tampering``: by anyone, except byte-code caches written
    by code other than the solution)."""
    where = _where

    def judge(args: tuple, caller: Frame) -> None:
        if mem := proc_memory_file(args[0] if args else None):
            o = owner(caller) or involved(caller)
            refuse("host_compute", f"open({mem!r}): a process's memory read or written as a file"
                   + (f" from {where(o)}" if o else " while the solution ran"))
            return
        path, mode, flags = (list(args) + [None, None, None])[:3]
        writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or \
            (isinstance(mode, str) and any(c in mode for c in "wax+"))
        if writing and (p := protected_path(path)):
            o = owner(caller)
            if o or not p.endswith(".pyc"):
                refuse("harness_tampering", f"open({p!r}, {mode or flags!r}) for writing"
                       + (f" from {where(o)}" if o else ""))

    return judge


def _path_judge(protected_path: Callable[[Any], str | None], owner: Owner, involved: Owner,
                refuse: Refuse) -> Callable[[str, tuple, Frame], None]:
    """Judge of ``_PATH_EVENTS``: a symbolic link the solution makes that can reach a process's
    memory file (rule ``host_compute``), and a protected path renamed, removed, linked or changed
    (rule ``harness_tampering``: by anyone, except byte-code caches by code other than the
    solution)."""
    where = _where

    def judge(event: str, args: tuple, caller: Frame) -> None:
        if event == "os.symlink" and len(args) > 1 and symlink_into_proc(args[0], args[1]) and \
                (o := owner(caller) or involved(caller)):
            refuse("host_compute", f"os.symlink({str(args[0])[:80]!r}): a link that can reach a process's "
                   f"memory file, from {where(o)}")
            return
        for i in _PATH_EVENTS[event]:
            if i < len(args) and (p := protected_path(args[i])):
                o = owner(caller)
                if o or not p.endswith(".pyc"):
                    refuse("harness_tampering", f"{event}({p!r})" + (f" from {where(o)}" if o else ""))

    return judge


def solution_caller(solution_path: str, depth: int = 2) -> str | None:
    """``file:line`` of the code that called the function ``depth - 1`` frames up, when that code
    is the solution's (the first frame outside the standard library is in the solution's folder
    or was compiled from a string); None when the harness, PyTorch or another library called."""
    std_dirs, site_dirs = _stdlib_dirs()
    scope = solution_scope(solution_path)
    f: FrameType | None = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith("<frozen") or (fn.startswith(std_dirs) and not fn.startswith(site_dirs)):
            f = f.f_back
            continue
        if is_solution_file(fn, scope) or fn.startswith("<"):
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        return None
    return None

