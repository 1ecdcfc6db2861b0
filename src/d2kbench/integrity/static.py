"""Static rules: an ``ast`` review of a solution's source (run in the trusted parent).

These rules back the run-time monitors; they are not the only line of defence (any static
check can be evaded by code that computes names at run time, which is why dynamic lookups are a
rule of their own). Names are resolved through the file's imports, so ``from torch import matmul
as mm; mm(a, b)``, ``import torch.nn.functional as F; F.linear(...)`` and
``getattr(torch, "matmul")`` are all seen as ``torch.matmul``. Code inside ``@triton.jit``
functions is Triton, not PyTorch, and is exempt from the operator rules.

Modules the solution imports from its own folder are reviewed with the same rules (an agent
cannot move the cheat into a helper file next to the solution).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from d2kbench.results import Violation

#: Modules a solution may not import (prefix match on dotted names) -> rule.
FORBIDDEN_MODULES: dict[str, str] = {
    **{m: "ast_forbidden_import" for m in (
        "ctypes", "_ctypes", "cffi", "cupy", "cupyx", "pycuda", "numba", "cuda", "nvmath", "tilelang",
        "cutlass", "flashinfer", "flash_attn", "flash_attn_interface", "xformers", "vllm", "sglang",
        "sgl_kernel", "apex", "transformer_engine", "deep_gemm", "liger_kernel", "bitsandbytes",
        "thunderkittens", "torchao", "triton_kernels", "torch.utils.cpp_extension", "torch._inductor",
        "torch._dynamo", "torch._C", "torch._higher_order_ops", "threading", "_thread", "multiprocessing",
        "torch.multiprocessing", "concurrent", "asyncio", "subprocess", "signal", "gc", "inspect",
        "d2kbench", "importlib", "builtins", "socket", "mmap", "pty", "sysconfig", "site",
        "_posixsubprocess", "posix", "_posixshmem", "resource", "fcntl", "sqlite3", "_sqlite3", "shutil",
    )},
    **{m: "ast_host_compute" for m in ("numpy", "jax", "cupy.numpy")},
}
#: Methods and functions that hand tensor data to host code (rule ``ast_host_compute`` outside
#: ``@triton.jit`` code).
HOST_ACCESS_METHODS = {"numpy", "tolist", "cpu", "from_numpy", "__array__", "__dlpack__", "to_dlpack", "from_dlpack"}

#: PyTorch callables that reach vendor kernels or decompositions (resolved dotted names).
FORBIDDEN_TORCH = {
    "torch.matmul", "torch.mm", "torch.bmm", "torch.einsum", "torch.baddbmm", "torch.addmm",
    "torch.addbmm", "torch.addmv", "torch.addr", "torch.mv", "torch.dot", "torch.vdot", "torch.inner",
    "torch.outer", "torch.ger", "torch.tensordot", "torch.chain_matmul", "torch.kron", "torch.cdist",
    "torch.svd", "torch.qr", "torch.cholesky", "torch.lu", "torch.pinverse", "torch.det", "torch.inverse",
    "torch._scaled_mm", "torch._int_mm", "torch.conv1d", "torch.conv2d", "torch.conv3d",
    "torch.nn.functional.linear", "torch.nn.functional.bilinear",
    "torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.multi_head_attention_forward",
    "torch.nn.functional.conv1d", "torch.nn.functional.conv2d", "torch.nn.functional.conv3d",
    "torch.nn.Linear", "torch.nn.Bilinear", "torch.nn.MultiheadAttention", "torch.nn.functional.grouped_mm",
    "torch._grouped_mm", "torch.nn.attention",
}
#: Prefixes of forbidden PyTorch namespaces.
FORBIDDEN_TORCH_PREFIXES = ("torch.linalg.", "torch.fft.", "torch.ops.", "torch._C._nn.", "torch.special.")
#: Method names that are matrix products on any object (tensors, arrays).
FORBIDDEN_METHODS = {"matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "dot", "einsum",
                     "__matmul__", "__rmatmul__", "tensordot", "outer", "inner", "svd", "qr", "cholesky"}
#: torch.* callables that are glue (allocation, metadata); anything else rooted at torch in an
#: exception handler counts as a PyTorch fallback.
TORCH_GLUE = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "arange", "tensor", "as_tensor", "as_strided", "cat", "stack", "device", "dtype", "Size", "finfo", "iinfo",
    "is_tensor", "get_default_dtype", "cuda", "backends", "Generator", "manual_seed",
}
#: Tensor methods that compute (for the try/except fallback rule only: inside an exception
#: handler, ``x.softmax(-1)`` is as much a PyTorch fallback as ``torch.softmax(x, -1)``).
COMPUTE_METHODS = {"softmax", "log_softmax", "sum", "mean", "exp", "log", "sqrt", "rsqrt", "norm", "cumsum", "topk",
                   "sort", "argsort", "amax", "amin", "var", "std", "pow", "sigmoid", "silu", "gelu", "relu", "tanh",
                   "mul", "add", "sub", "div", "addcmul", "lerp", "masked_fill", "scatter", "scatter_add", "gather",
                   "index_select", "index_add", "bincount", "histc", "clamp", "square", "reciprocal", "logsumexp"}
COMPILE_NAMES = {"torch.compile", "torch.jit.script", "torch.jit.trace", "torch.export.export",
                 "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline"}
COMPILE_PREFIXES = ("torch._dynamo.", "torch._inductor.", "torch.utils.cpp_extension.", "torch.jit.")
INTROSPECTION_ATTRS = {
    "_getframe", "_current_frames", "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame",
    "cr_frame", "ag_frame", "__globals__", "__closure__", "__code__", "cell_contents", "__subclasses__",
    "__builtins__", "_python_dispatch", "_get_current_dispatch_mode", "_get_current_dispatch_mode_stack",
    "_pop_mode", "_push_mode", "_disable_current_modes", "_unset_dispatch_mode", "_set_dispatch_mode",
    "_DisableTorchDispatch", "DisableTorchFunction", "_DisableTorchFunction", "_ExcludeDispatchKeyGuard",
    "_DisableFuncTorch", "settrace", "setprofile", "addaudithook", "get_objects", "get_referrers",
    "get_referents", "current_process", "_debug_has_internal_overlap",
}
INTROSPECTION_NAMES = {"sys.modules", "sys.monitoring", "sys.meta_path", "sys.path_hooks"}
#: Roots whose attributes a solution may not assign to.
PROTECTED_ROOTS = ("torch", "triton", "time", "numpy", "multiprocessing", "builtins", "sys", "d2kbench",
                   "threading", "os", "math", "functools", "pickle", "copyreg", "warnings")
CAPTURE_NAMES = {"is_current_stream_capturing", "CUDAGraph", "graph_pool_handle", "make_graphed_callables",
                 "_cuda_isCurrentStreamCapturing", "is_capturing"}
_L2_PATTERN = re.compile(r"accesspolicywindow|persistingl2|persisting_l2|cudalimitpersisting|"
                         r"cudastreamsetattribute|hitratio|hitprop|cudadevicesetlimit", re.I)
PROCESS_CALLS = {"os._exit", "sys.exit", "exit", "quit", "os.kill", "os.killpg", "os.fork", "os.forkpty",
                 "os.system", "os.abort", "os.popen", "os.posix_spawn", "os.posix_spawnp", "os.setsid"}
DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__", "globals", "vars", "breakpoint"}


@dataclass
class _Finding:
    rule: str
    path: Path
    line: int
    what: str

    def violation(self, root: Path) -> Violation:
        where: Path | str
        try:
            where = self.path.relative_to(root)
        except ValueError:
            where = self.path.name
        return Violation(rule=self.rule, evidence=f"{where}:{self.line}: {self.what}")


@dataclass
class _Analyzer(ast.NodeVisitor):
    path: Path
    source: str
    extra_forbidden: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    findings: list[_Finding] = field(default_factory=list)
    local_imports: list[str] = field(default_factory=list)
    in_jit: int = 0

    # ---- helpers --------------------------------------------------------------------------
    def add(self, rule: str, node: ast.AST, what: str = "") -> None:
        line = getattr(node, "lineno", 0)
        text = what or ast.get_source_segment(self.source, node) or ""
        text = " ".join(text.split())
        self.findings.append(_Finding(rule, self.path, line, text[:120]))

    def qualname(self, node: ast.AST) -> str | None:
        """Dotted name of ``node`` through the file's import aliases (None if not a plain chain)."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            base = self.qualname(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def _is_jit(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        for d in fn.decorator_list:
            target = d.func if isinstance(d, ast.Call) else d
            name = self.qualname(target) or ""
            if name.startswith("triton.") or name in ("jit", "autotune", "heuristics"):
                return True
        return False

    @staticmethod
    def _module_rule(module: str, extra: tuple[str, ...]) -> str | None:
        for prefix in (*FORBIDDEN_MODULES, *extra):
            if module == prefix or module.startswith(prefix + "."):
                return FORBIDDEN_MODULES.get(prefix, "ast_forbidden_import")
        return None

    def _forbidden_name(self, name: str) -> bool:
        return name in FORBIDDEN_TORCH or name.startswith(FORBIDDEN_TORCH_PREFIXES)

    def _compute_name(self, name: str | None) -> bool:
        """A torch callable that is not glue (for the try/except fallback rule)."""
        if not name or not name.startswith("torch."):
            return False
        head = name.split(".")[1]
        return self._forbidden_name(name) or head not in TORCH_GLUE

    # ---- imports --------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                self.aliases[top] = top
            self._check_import(node, a.name)
            self.local_imports.append(a.name.split(".")[0])
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level:  # relative import: a sibling module of the solution
            self.local_imports.extend([mod.split(".")[0]] if mod else [a.name for a in node.names])
        else:
            self._check_import(node, mod)
            self.local_imports.append(mod.split(".")[0])
        for a in node.names:
            full = f"{mod}.{a.name}" if mod else a.name
            self.aliases[a.asname or a.name] = full
            if not node.level:
                self._check_import(node, full)  # `from torch.utils import cpp_extension`
        self.generic_visit(node)

    def _check_import(self, node: ast.AST, module: str) -> None:
        rule = self._module_rule(module, self.extra_forbidden)
        if rule:
            self.add(rule, node, f"import {module}")
        if module.split(".")[0] in ("reference", "d2k_task_reference"):
            self.add("ast_reference_import", node, f"import {module}")

    def _compile_or_forbidden(self, name: str) -> bool:
        return name in COMPILE_NAMES or name.startswith(COMPILE_PREFIXES) or self._forbidden_name(name)

    # ---- definitions ----------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        jit = self._is_jit(node)
        self.in_jit += jit
        for d in node.decorator_list:
            self.visit(d)
        for stmt in node.body:
            self.visit(stmt)
        self.in_jit -= jit
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.add("ast_tensor_subclass", node, f"def {node.name}")

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            name = self.qualname(b) or ""
            if name in ("torch.Tensor", "torch._tensor.Tensor", "torch.nn.Parameter") or name.endswith("TorchDispatchMode") \
                    or name.endswith("TorchFunctionMode"):
                self.add("ast_tensor_subclass", node, f"class {node.name}({name})")
        self.generic_visit(node)

    # ---- expressions ----------------------------------------------------------------------
    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_jit:
            self.add("ast_forbidden_call", node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_jit:
            self.add("ast_forbidden_call", node)
        self._check_targets([node.target], node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_targets(node.targets, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_targets([node.target], node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_targets(node.targets, node)
        self.generic_visit(node)

    def _check_targets(self, targets: list[ast.expr], node: ast.AST) -> None:
        for t in targets:
            if isinstance(t, (ast.Tuple, ast.List)):
                self._check_targets(list(t.elts), node)
            elif isinstance(t, ast.Attribute):
                name = self.qualname(t) or ""
                if name.split(".")[0] in PROTECTED_ROOTS and name.count(".") >= 1:
                    self.add("ast_monkeypatch", node, f"assignment to {name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.qualname(node)
        if node.attr in INTROSPECTION_ATTRS or (name and (name in INTROSPECTION_NAMES or name.startswith("torch._C."))):
            self.add("ast_introspection", node)
        if node.attr in CAPTURE_NAMES or (name or "").startswith("torch.cuda.graph"):
            self.add("ast_capture_aware", node)
        if _L2_PATTERN.search(node.attr):
            self.add("ast_l2_persistence", node)
        if name and not self.in_jit and isinstance(node.ctx, ast.Load):
            self._check_callable(node, name)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        name = self.aliases.get(node.id)
        if name and name != node.id and not self.in_jit and isinstance(node.ctx, ast.Load):
            self._check_callable(node, name)  # e.g. `from torch import matmul as mm` then `mm`
        if _L2_PATTERN.search(node.id):
            self.add("ast_l2_persistence", node)
        self.generic_visit(node)

    def _check_callable(self, node: ast.AST, name: str) -> None:
        if name in COMPILE_NAMES or name.startswith(COMPILE_PREFIXES):
            self.add("ast_compile", node)
        elif self._forbidden_name(name):
            self.add("ast_forbidden_call", node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            if _L2_PATTERN.search(node.value):
                self.add("ast_l2_persistence", node)
            if "d2k_task_reference" in node.value:
                self.add("ast_reference_import", node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.qualname(func)
        if isinstance(func, ast.Name) and func.id in DYNAMIC_CALLS and func.id not in self.aliases:
            self.add("ast_dynamic_code", node)
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "delattr") and node.args:
            base = self.qualname(node.args[0]) or ""
            root = base.split(".")[0]
            if func.id != "getattr" and root in PROTECTED_ROOTS:
                self.add("ast_monkeypatch", node)
            elif func.id == "getattr" and root in ("torch", "triton", "sys", "d2kbench") and not (
                    len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                self.add("ast_dynamic_code", node)
            elif func.id == "getattr" and (resolved := self.qualname(node)) and not self.in_jit:
                self._check_callable(node, resolved)
                if resolved.rsplit(".", 1)[-1] in INTROSPECTION_ATTRS:
                    self.add("ast_introspection", node)
        if name in PROCESS_CALLS or (name or "").startswith(("os.exec", "os.spawn", "signal.")):
            self.add("ast_process_control", node)
        if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_METHODS and not self.in_jit \
                and not (name or "").startswith(("triton.", "tl.")):
            self.add("ast_forbidden_call", node)
        if isinstance(func, ast.Attribute) and not self.in_jit and (
                func.attr in HOST_ACCESS_METHODS or (func.attr == "to" and _names_cpu(node))):
            self.add("ast_host_compute", node)
        if isinstance(func, ast.Attribute) and func.attr in ("_make_subclass", "_make_wrapper_subclass", "as_subclass"):
            self.add("ast_tensor_subclass", node)
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        if not self.in_jit:
            for h in node.handlers:
                for sub in ast.walk(ast.Module(body=h.body, type_ignores=[])):
                    if self._fallback_node(sub):
                        self.add("ast_try_fallback", h, f"except handler at line {h.lineno} falls back to "
                                 + " ".join((ast.get_source_segment(self.source, sub) or "").split())[:80])
                        break
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def _fallback_node(self, sub: ast.AST) -> bool:
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            return True
        if isinstance(sub, ast.Call):
            name = self.qualname(sub.func)
            if self._compute_name(name):
                return True
            if isinstance(sub.func, ast.Attribute) and sub.func.attr in FORBIDDEN_METHODS | COMPUTE_METHODS:
                return True
            if name and name.split(".")[-1] in ("run", "reference", "ref_run", "fallback") and \
                    name.split(".")[0] not in ("self",):
                return True
        return False


def _analyze(path: Path, extra_forbidden: tuple[str, ...]) -> _Analyzer | None:
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None  # the worker reports the import failure (compile_error)
    a = _Analyzer(path=path, source=source, extra_forbidden=extra_forbidden)
    a.visit(tree)
    return a


def _names_cpu(call: ast.Call) -> bool:
    """``x.to("cpu")`` / ``x.to(device="cpu")`` / ``x.to(torch.device("cpu"))``."""
    vals = list(call.args) + [k.value for k in call.keywords if k.arg == "device"]
    for v in vals:
        if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.split(":")[0] == "cpu":
            return True
        if isinstance(v, ast.Call) and v.args and isinstance(v.args[0], ast.Constant) and v.args[0].value == "cpu":
            return True
    return False


def _reviewed(solution: Path, forbidden_modules: tuple[str, ...] = ()):
    """``(path, analysis or None)`` for the solution file and, transitively, every module it
    imports from its own folder (``mod.py`` or the package ``mod/__init__.py``)."""
    path = Path(solution).resolve()
    root = path.parent
    todo, seen = [path], set()
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.add(p)
        a = _analyze(p, forbidden_modules)
        yield p, a
        for mod in (a.local_imports if a is not None else []):
            for cand in (root / f"{mod}.py", root / mod / "__init__.py"):
                if mod and cand.is_file():
                    todo.append(cand.resolve())


def solution_files(solution: str | Path) -> list[Path]:
    """The files the static review reads for ``solution``: the file itself and the modules it
    imports from its own folder, transitively (a package counts with every ``.py`` file in
    it). The harness stages exactly these into a worker (:mod:`d2kbench.harness.process`), so
    the code that runs is the code that was reviewed."""
    out: list[Path] = []
    for p, _a in _reviewed(Path(solution)):
        files = sorted(p.parent.rglob("*.py")) if p.name == "__init__.py" and p.parent != Path(solution).resolve().parent \
            else [p]
        out += [f for f in files if f not in out]
    return out


def syntax_problem(solution: str | Path) -> str | None:
    """``file:line: message`` of the first file of :func:`solution_files` that does not
    compile to byte code (a syntax or indentation error), or None. Lets the harness report a
    compile error before it starts any worker."""
    for p in solution_files(solution):
        try:
            compile(p.read_bytes(), str(p), "exec")
        except SyntaxError as e:
            return f"{p.name}:{e.lineno}: {type(e).__name__}: {e.msg}"
        except (ValueError, OSError) as e:
            return f"{p.name}: {type(e).__name__}: {e}"
    return None


def static_violations(solution: str | Path, forbidden_modules: list[str] | tuple[str, ...] = (),
                      limit: int = 25) -> list[Violation]:
    """Review ``solution`` (and the modules it imports from its own folder) with the static rules.

    Args:
        solution: path of the solution file.
        forbidden_modules: extra module prefixes (the task's ``forbidden.modules``).
        limit: at most this many violations (the first ones, in file order).

    Returns:
        One :class:`Violation` per finding, ``evidence`` = ``file:line: source``; empty if clean
        (or if the file does not parse: the worker reports that as a compile error).
    """
    root = Path(solution).resolve().parent
    findings = [f for _p, a in _reviewed(Path(solution), tuple(forbidden_modules)) if a is not None
                for f in a.findings]
    uniq, keys = [], set()
    for f in findings:
        key = (f.rule, f.path, f.line)
        if key not in keys:
            keys.add(key)
            uniq.append(f)
    return [f.violation(root) for f in uniq[:limit]]
