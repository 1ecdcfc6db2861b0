"""Triton portability lint: names in ``@triton.jit`` code that the CPU interpreter accepts but the
GPU compiler rejects.

Under ``TRITON_INTERPRET=1`` a kernel body is plain Python: it may read any module global and
call any Python builtin. The real compiler (``triton/compiler/code_generator.py``, triton 3.6)
resolves names itself and is much stricter, so a solution that passes every CPU check can still
fail on the GPU with ``CompilationError ... NameError("Cannot access global variable EPS from
within @jit'ed function ...")``. This module finds that class of defect on the CPU, without
compiling. For every ``@triton.jit`` function defined in a module (a ``JITFunction``, its
interpreter stand-in ``InterpretedFunction``, or either under ``@triton.autotune`` /
``@triton.heuristics``), it walks the function's AST and looks at every name the body loads
that is not a parameter or a local (assigned anywhere in the function, loop and comprehension
variables included). Argument defaults and annotations are skipped, as the compiler skips them.

Rules (mirroring the installed Triton; the allow-lists are read from it where it exposes them):

``triton_global`` -- a global (or closure variable) whose value the code generator's
    ``global_lookup`` refuses. Allowed: a name of the compiler's ``builtin_namespace``
    (``len list range float int isinstance getattr hasattr print min max``); a module; a
    ``JITCallable`` (a ``@triton.jit`` function; ``InterpretedFunction`` under the interpreter);
    anything marked ``__triton_builtin__`` or ``__triton_aggregate__``; anything whose
    ``__module__`` is under ``triton.language`` (or gluon's language); a ``tl.dtype``; a
    namedtuple class; ``None`` or a ``tl.constexpr`` instance. Everything else -- a plain
    ``float``/``int``/``str``/``tuple``, a torch dtype, a non-jit Python function -- is a
    compile error. Fix: ``EPS = tl.constexpr(1e-10)`` (``EPS: tl.constexpr = 1e-10`` is NOT
    enough: an annotation does not make the value a constexpr) or pass it as a ``tl.constexpr``
    argument. ``TRITON_ALLOW_NON_CONSTEXPR_GLOBALS`` is deliberately ignored: the benchmark's
    GPU runs do not set it.
``triton_builtin`` -- a Python builtin outside that ``builtin_namespace`` (``abs``, ``zip``,
    ``enumerate``, ``tuple``, ``sum``, ``round``...): the compiler does not see Python's
    builtins and raises ``NameError: abs is not defined``.
``triton_unsupported_call`` -- an attribute of a non-Triton module that is a plain callable
    (``torch.exp``, ``np.sqrt``, ``time.time``): the JIT's dependency scan raises
    ``RuntimeError: Unsupported function referenced`` (``math.*`` and ``triton.*`` are exempt,
    as in Triton).

Limits: the check is per function, not per launch, so it also reports code the GPU would never
compile: a helper no kernel calls, a kernel only the CPU path launches, or a branch under a
``tl.constexpr`` condition that is false on the GPU (the code generator skips dead constexpr
branches for the first two rules). That is why it is a lint (``d2k lint``) and not a gate in
the worker. ``devtools/compile_sm90.py`` compiles the launched kernels themselves for sm_90.

Importing a file runs it: :func:`check_file` imports in a child process (with
``TRITON_INTERPRET=1``, so no GPU is needed) unless told otherwise.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from d2kbench.tasks.loader import import_file

# Imports inside functions: triton's compiler loads when a file is linted.

#: The rules' names (the ``rule`` field of a :class:`Finding`).
RULES = ("triton_global", "triton_builtin", "triton_unsupported_call", "triton_lint_error")

#: Modules whose attributes the JIT's dependency scan does not inspect (``supported_modules``).
_SCAN_EXEMPT_MODULES = ("math", "copy")

#: The compiler's builtin namespace, if its code generator cannot be read (triton 3.6's list).
_FALLBACK_BUILTINS = frozenset({"len", "list", "range", "float", "int", "isinstance", "getattr", "hasattr",
                                "print", "min", "max"})


@dataclass(frozen=True)
class Finding:
    """One name in one ``@triton.jit`` function that the GPU compiler would reject."""

    rule: str
    path: str
    line: int
    function: str
    name: str
    what: str

    def __str__(self) -> str:
        return f"{Path(self.path).name}:{self.line}: {self.function}: {self.what}"


@functools.cache
def compiler_builtins() -> frozenset[str]:
    """Names the installed Triton compiler resolves without a global (its ``builtin_namespace``)."""
    try:
        from triton.compiler.code_generator import CodeGenerator

        return frozenset(CodeGenerator.builtin_namespace)
    except Exception:  # noqa: BLE001 - an older/newer layout: fall back to 3.6's list
        return _FALLBACK_BUILTINS


@functools.cache
def _triton_types() -> dict[str, Any]:
    import triton.language as tl

    out: dict[str, Any] = {"constexpr": tl.constexpr, "dtype": tl.dtype, "jit": ()}
    try:
        from triton.runtime.jit import JITCallable

        out["jit"] = (JITCallable,)
    except ImportError:  # older Triton
        from triton.runtime.jit import JITFunction

        out["jit"] = (JITFunction,)
    try:
        from triton.runtime.interpreter import InterpretedFunction

        out["jit"] = (*out["jit"], InterpretedFunction)  # what @triton.jit returns under the interpreter
    except ImportError:
        pass
    return out


def _is_namedtuple(val: Any) -> bool:
    return isinstance(val, type) and issubclass(val, tuple) and hasattr(val, "_fields")


def _attr(val: Any, name: str) -> Any:
    """``getattr(val, name, None)`` that survives objects whose ``__getattr__`` raises anything."""
    try:
        return getattr(val, name, None)
    except Exception:  # noqa: BLE001
        return None


def global_allowed(name: str, val: Any, builtin_names: frozenset[str] | None = None) -> bool:
    """Would the code generator's ``global_lookup`` accept global ``name`` bound to ``val``?"""
    tt = _triton_types()
    builtin_names = compiler_builtins() if builtin_names is None else builtin_names
    module = _attr(val, "__module__")
    module = module if isinstance(module, str) else ""
    return any((
        name in builtin_names,
        type(val) is types.ModuleType,
        isinstance(val, tt["jit"]),
        bool(_attr(val, "__triton_builtin__")),
        bool(_attr(val, "__triton_aggregate__")),
        module.startswith("triton.language"),
        module.startswith("triton.experimental.gluon.language"),
        isinstance(val, tt["dtype"]),
        _is_namedtuple(val),
        val is None or isinstance(val, (tt["constexpr"], tt["dtype"], *tt["jit"])),
    ))


def _scan_allowed(val: Any) -> bool:
    """Would the JIT's dependency scan (``DependenciesFinder.record_reference``) accept ``val``?"""
    tt = _triton_types()
    if val is None or type(val) is types.ModuleType:
        return True
    if _attr(val, "__triton_aggregate__") or _attr(val, "__triton_builtin__"):
        return True
    module = _attr(val, "__module__")
    if isinstance(module, str) and (module == "triton" or module.startswith("triton.")):
        return True
    if isinstance(val, tt["jit"]):
        return True
    return not (callable(val) and not isinstance(val, type) and not isinstance(val, tt["constexpr"]))


def _describe(val: Any) -> str:
    if isinstance(val, (int, float, bool, str)) or val is None:
        return f"{type(val).__name__} {val!r}"[:60]
    if inspect.isfunction(val) or inspect.isbuiltin(val):
        return f"plain Python function {getattr(val, '__qualname__', val)!s}"
    if isinstance(val, type):
        return f"class {val.__qualname__}"
    return type(val).__qualname__


def unwrap_jit(obj: Any) -> types.FunctionType | None:
    """The Python function under a ``@triton.jit`` object (through autotune/heuristics), else None."""
    tt = _triton_types()
    seen = 0
    cur = obj
    while seen < 8:
        if isinstance(cur, tt["jit"]):
            fn = getattr(cur, "fn", None)
            return fn if inspect.isfunction(fn) else None
        nxt = getattr(cur, "fn", None)
        if nxt is None or nxt is cur:
            return None
        try:
            from triton.runtime.autotuner import KernelInterface

            if not isinstance(cur, KernelInterface):
                return None
        except ImportError:
            return None
        cur = nxt
        seen += 1
    return None


def jit_functions(module: types.ModuleType) -> Iterator[tuple[str, types.FunctionType]]:
    """``(name, python function)`` of every ``@triton.jit`` function defined in ``module``."""
    seen = set()
    for name, obj in list(vars(module).items()):
        fn = unwrap_jit(obj)
        if fn is None or id(fn) in seen or getattr(fn, "__module__", None) != module.__name__:
            continue
        seen.add(id(fn))
        yield name, fn


def _function_ast(fn: types.FunctionType) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, int, str]:
    lines, first = inspect.getsourcelines(fn)
    src = textwrap.dedent("".join(lines))
    tree = ast.parse(src)
    node = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return node, first, inspect.getsourcefile(fn) or "<unknown>"


def _local_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = node.args
    names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node:
            names.add(sub.name)
        elif isinstance(sub, ast.alias):
            names.add((sub.asname or sub.name).split(".")[0])
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.add(sub.name)
    return names


def _body_nodes(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """Every node of the body (not the decorators, argument defaults or annotations)."""
    for stmt in node.body:
        yield from ast.walk(stmt)


def _attr_chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    attrs = []
    cur: ast.AST = node
    while isinstance(cur, ast.Attribute):
        attrs.append(cur.attr)
        cur = cur.value
    if not isinstance(cur, ast.Name):
        return None
    return cur.id, attrs[::-1]


def check_function(fn: types.FunctionType, name: str | None = None) -> list[Finding]:
    """Findings for one ``@triton.jit`` Python function (see the module docstring)."""
    name = name or fn.__name__
    try:
        node, first, path = _function_ast(fn)
    except (OSError, TypeError, SyntaxError, StopIteration) as e:
        return [Finding("triton_lint_error", getattr(fn.__code__, "co_filename", "?"),
                        fn.__code__.co_firstlineno, name, "", f"source not readable: {e}")]
    scope = dict(fn.__globals__)
    if fn.__closure__:
        scope.update({v: c.cell_contents for v, c in zip(fn.__code__.co_freevars, fn.__closure__)
                      if _cell_filled(c)})
    local = _local_names(node)
    builtin_names = compiler_builtins()
    absent = object()
    out: list[Finding] = []
    reported: set[tuple[str, str]] = set()

    def add(rule: str, sub: ast.AST, ident: str, what: str) -> None:
        if (rule, ident) in reported:
            return
        reported.add((rule, ident))
        out.append(Finding(rule, path, first + getattr(sub, "lineno", 1) - 1, name, ident, what))

    for sub in _body_nodes(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in local:
            val = scope.get(sub.id, absent)
            if val is absent:
                if sub.id not in builtin_names and hasattr(builtins, sub.id):
                    add("triton_builtin", sub, sub.id,
                        f"Python builtin {sub.id!r} is not available to compiled Triton code (the GPU compiler "
                        f"raises NameError: {sub.id} is not defined; the interpreter accepts it)")
                continue
            if not global_allowed(sub.id, val, builtin_names):
                if callable(val) and not isinstance(val, type):
                    add("triton_global", sub, sub.id,
                        f"global {sub.id!r} ({_describe(val)}) is not a @triton.jit function: the GPU compiler "
                        f"raises \"Unsupported function referenced\" (the interpreter runs it as Python); "
                        f"decorate it with @triton.jit")
                else:
                    add("triton_global", sub, sub.id,
                        f"global {sub.id!r} ({_describe(val)}) is not a tl.constexpr: the GPU compiler raises "
                        f"\"Cannot access global variable {sub.id} from within @jit'ed function\"; define it "
                        f"as {sub.id} = tl.constexpr(...) or pass it as a tl.constexpr argument")
        elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
            chain = _attr_chain(sub)
            if chain is None or chain[0] in local:
                continue
            root = scope.get(chain[0], absent)
            if type(root) is not types.ModuleType:
                continue
            val, ok = root, True
            for attr in chain[1]:
                if type(val) is types.ModuleType and (val.__name__ in _SCAN_EXEMPT_MODULES
                                                      or val.__name__ == "triton.language"
                                                      or val.__name__.startswith("triton.language.")
                                                      or val.__name__.startswith("triton.experimental.gluon")):
                    ok = False  # the scan stops at supported modules
                    break
                val = getattr(val, attr, absent)
                if val is absent:
                    ok = False
                    break
            if ok and not _scan_allowed(val):
                dotted = ".".join([chain[0], *chain[1]])
                add("triton_unsupported_call", sub, dotted,
                    f"{dotted} ({_describe(val)}) is not Triton code: the GPU compiler raises "
                    f"\"Unsupported function referenced\" (the interpreter runs it as Python)")
    return out


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
        return True
    except ValueError:
        return False


def check_module(module: types.ModuleType) -> list[Finding]:
    """Findings for every ``@triton.jit`` function defined in ``module``, in source order."""
    out: list[Finding] = []
    for name, fn in jit_functions(module):
        out.extend(check_function(fn, name))
    return sorted(out, key=lambda f: (f.path, f.line))


def check_file_in_process(path: str | Path) -> list[Finding]:
    """Import ``path`` in this process (runs its code!) and check it; import errors are a finding."""
    path = Path(path).resolve()
    try:
        module = import_file(path)
    except BaseException as e:  # noqa: BLE001 - report, do not crash the lint
        return [Finding("triton_lint_error", str(path), 0, "<module>", "", f"import failed: {type(e).__name__}: {e}")]
    try:
        found = check_module(module)
        # helpers the file imports from its own folder (``import my_kernels``) are part of the solution
        for other in list(sys.modules.values()):
            f = getattr(other, "__file__", None)
            if other is not module and isinstance(f, str) and Path(f).resolve().parent == path.parent:
                found.extend(check_module(other))
        return found
    finally:
        sys.modules.pop(module.__name__, None)


def check_files(paths: Sequence[str | Path], timeout_s: float = 300.0) -> dict[str, list[Finding]]:
    """Check files in one child process (``TRITON_INTERPRET=1``): importing a file runs its code,
    which must not touch this process. If the child fails, each file is retried in its own child.

    Returns:
        ``{resolved path: findings}``; a ``triton_lint_error`` finding for a file whose check failed.
    """
    resolved = [str(Path(p).resolve()) for p in paths]
    if not resolved:
        return {}
    out = _run_child(resolved, timeout_s)
    if out is None:
        out = {}
        for p in resolved:
            one = _run_child([p], timeout_s)
            out[p] = one[p] if one is not None and p in one else [
                Finding("triton_lint_error", p, 0, "<module>", "", "the lint child failed or timed out")]
    return out


def check_file(path: str | Path, timeout_s: float = 120.0) -> list[Finding]:
    """:func:`check_files` for one file."""
    return next(iter(check_files([path], timeout_s).values()))


def _run_child(paths: list[str], timeout_s: float) -> dict[str, list[Finding]] | None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    src_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src_root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.run([sys.executable, "-m", "d2kbench.integrity.triton_lint", "--json", *paths],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=str(Path(paths[0]).parent), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith(_JSON_TAG):
            try:
                rows = json.loads(line[len(_JSON_TAG):])
                return {p: [Finding(**r) for r in rows.get(p, [])] for p in paths}
            except (ValueError, TypeError):
                return None
    return None


_JSON_TAG = "D2K_TRITON_LINT_JSON "


def main(argv: list[str] | None = None) -> int:
    """``python -m d2kbench.integrity.triton_lint [--json] FILE...`` (imports in this process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    files = [a for a in argv if a != "--json"]
    found = {str(Path(p).resolve()): check_file_in_process(p) for p in files}
    if as_json:
        sys.stdout.flush()
        print(_JSON_TAG + json.dumps({p: [asdict(f) for f in fs] for p, fs in found.items()}), flush=True)
    else:
        for fs in found.values():
            for f in fs:
                print(f"{f.rule}: {f}")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
