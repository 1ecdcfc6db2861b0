"""The worker-side monitors around an untrusted solution (:class:`Guard`).

Installed by :mod:`d2kbench.harness.worker` *before* the solution is imported:

* the audit hook of :mod:`d2kbench.integrity.audit` (frames, gc, ctypes, processes, writes);
* a launch counter on ``JITFunction.run`` and the interpreter's ``InterpretedFunction.run``
  (so launches are counted under ``TRITON_INTERPRET=1`` too; :mod:`d2kbench.integrity.launches`);
* wrappers on forbidden entry points that are already imported (``torch.compile``,
  ``cpp_extension.load_inline``, ...);
* an identity snapshot of every function and class the harness relies on (timers, events,
  synchronize, graphs, the pipe, the harness's own timing/worker code, builtins, the task's
  input generator), with their ``__code__`` objects;
* the set of live Python threads, and (GPU) the persisting-L2 set-aside.

Around each correctness call a :class:`~torch.utils._python_dispatch.TorchDispatchMode` records
the ATen ops. After each call, after timing and after import the guard reports what changed as
``{"rule", "evidence"}`` dicts that travel to the parent with the answer.

Everything here runs in the same process as the solution, so it is tamper-*evident*, not
tamper-proof; the trusted parent re-checks results (:mod:`d2kbench.integrity.parent`).
"""

from __future__ import annotations

import contextlib
import random
import threading
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from d2kbench.checking.aliases import find_aliases
from d2kbench.integrity import audit, gpu, ops
from d2kbench.integrity.launches import Launches, describe_launches
from d2kbench.tasks.schema import TensorArg

# Imports inside functions: monitors installed in the worker: torch, triton and the profiler load when the guard is
# installed, after the worker's measured torch import.

#: Dotted names whose identity (and ``__code__``) must not change while the solution is loaded.
CRITICAL = (
    "time.perf_counter", "time.perf_counter_ns", "time.time", "time.monotonic", "time.sleep",
    "torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize", "torch.cuda.Event.query", "torch.cuda.Stream", "torch.cuda.Stream.wait_stream",
    "torch.cuda.current_stream", "torch.cuda.stream", "torch.cuda.graph", "torch.cuda.CUDAGraph",
    "torch.cuda.CUDAGraph.replay", "torch.cuda.CUDAGraph.capture_begin", "torch.cuda.CUDAGraph.capture_end",
    "torch.cuda.get_device_properties", "torch.cuda.is_available",
    "torch.use_deterministic_algorithms", "torch.are_deterministic_algorithms_enabled", "torch.empty",
    "torch._C._set_deterministic_algorithms",
    "torch.isfinite", "torch.Tensor", "torch.Tensor.clone", "torch.Tensor.detach", "torch.Tensor.copy_",
    "torch.Tensor.zero_", "torch.Tensor.fill_", "torch.Tensor.untyped_storage", "torch.Tensor.data_ptr",
    "torch.profiler.profile", "torch.autograd.profiler.profile", "torch.autograd.profiler.profile.__enter__",
    "torch.autograd.profiler.profile.__exit__", "torch.autograd.profiler.record_function",
    "torch.utils._python_dispatch.TorchDispatchMode",
    "torch.utils._python_dispatch._get_current_dispatch_mode_stack",
    "multiprocessing.connection.Connection.send", "multiprocessing.connection.Connection.recv",
    "multiprocessing.connection.Connection.poll", "multiprocessing.connection.Connection._send_bytes",
    "multiprocessing.connection.Connection._recv_bytes", "multiprocessing.connection.Connection._send",
    "multiprocessing.connection.Connection._recv", "multiprocessing.reduction.ForkingPickler.dumps",
    "multiprocessing.reduction.ForkingPickler.register",
    "numpy.asarray", "numpy.percentile", "numpy.median", "numpy.isfinite", "numpy.random.default_rng",
    "builtins.type", "builtins.isinstance", "builtins.issubclass", "builtins.len", "builtins.id",
    "builtins.getattr", "builtins.__import__", "builtins.list", "builtins.min", "builtins.max", "builtins.sum",
    "triton.runtime.jit.JITFunction.run", "triton.runtime.interpreter.InterpretedFunction.run",
    "triton.runtime.autotuner.Autotuner.run",
)
#: Harness modules whose every function and class method is part of the snapshot.
HARNESS_MODULES = ("d2kbench.harness.timing", "d2kbench.harness.worker", "d2kbench.checking.inputs",
                   "d2kbench.checking.aliases",
                   "d2kbench.results", "d2kbench.integrity.guard", "d2kbench.integrity.gpu",
                   "d2kbench.integrity.ops", "d2kbench.integrity.audit", "d2kbench.integrity.launches",
                   "d2kbench.tasks.loader")
#: Forbidden entry points that may already be imported when the solution runs.
ENTRY_POINTS = ("torch.compile", "torch._dynamo.optimize", "torch._dynamo.export",
                "torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
                "torch.utils.cpp_extension._jit_compile", "torch.jit.script", "torch.jit.trace")


def _resolve(dotted: str, import_missing: bool = True):
    """The object at ``dotted`` (module path, then attributes), or None; with
    ``import_missing=False`` only modules already imported are looked at."""
    import importlib
    import sys

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            if not import_missing:
                continue
            try:
                mod = importlib.import_module(".".join(parts[:i]))
            except Exception:  # noqa: BLE001 - not every name exists on every build
                continue
        obj = mod
        try:
            for p in parts[i:]:
                if not import_missing and isinstance(obj, types.ModuleType):
                    obj = obj.__dict__[p]  # a module's __getattr__ may import lazily (torch._dynamo)
                else:
                    obj = obj.__dict__[p] if isinstance(obj, type) and p in obj.__dict__ else getattr(obj, p)
        except (AttributeError, KeyError):
            return None
        return obj
    return None


#: Threads the harness itself starts (module, qualname of the target): the fd-passing server
#: multiprocessing starts when the first tensor crosses the pipe.
INFRA_THREADS = {("multiprocessing.resource_sharer", "_ResourceSharer._serve")}


def _infra(t: threading.Thread) -> bool:
    target = getattr(t, "_target", None)
    func = getattr(target, "__func__", target)
    return (getattr(func, "__module__", None), getattr(func, "__qualname__", None)) in INFRA_THREADS


def _fingerprint(obj) -> tuple:
    code = getattr(obj, "__code__", None)
    func = getattr(obj, "__func__", None)
    return (id(obj), id(code) if code is not None else None,
            id(getattr(func, "__code__", None)) if func is not None else None,
            id(getattr(obj, "__defaults__", None)))


def _describe(obj) -> str:
    mod = getattr(obj, "__module__", "?")
    name = getattr(obj, "__qualname__", type(obj).__name__)
    code = getattr(obj, "__code__", None)
    where = f" ({Path(code.co_filename).name}:{code.co_firstlineno})" if code is not None else ""
    return f"{mod}.{name}{where}"


#: Ways to reach a tensor's data from host code (rule ``host_compute`` when solution code calls
#: them): numpy views and copies, Python lists, DLPack capsules, serialisation to bytes.
HOST_ACCESS = ("torch.Tensor.numpy", "torch.Tensor.tolist", "torch.Tensor.__array__", "torch.Tensor.__dlpack__",
               "torch.Tensor.__reduce_ex__", "torch.utils.dlpack.to_dlpack", "torch.save",
               "torch.UntypedStorage.tolist", "torch.storage.TypedStorage.tolist", "torch.UntypedStorage.__reduce__",
               "torch.storage.TypedStorage.__reduce__")


def _alive_thread_ids() -> dict[int, object]:
    """Every thread with a Python thread state, by id, with its current frame: also threads
    started with ``_thread.start_new_thread``, which ``threading.enumerate()`` does not list."""
    import sys

    return dict(sys._current_frames())


def storage_spans(outputs) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of the storages of the tensors in ``outputs``."""
    import torch

    spans = []
    for o in outputs:
        if isinstance(o, torch.Tensor) and o.untyped_storage().nbytes():
            st = o.untyped_storage()
            spans.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
    return spans


def overlapping(spans: list[tuple[int, int]], held: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The first span of ``spans`` that overlaps one of ``held``, or None."""
    for lo, hi in spans:
        for hlo, hhi in held:
            if lo < hhi and hlo < hi:
                return lo, hi
    return None


class _CpuOpProfile:
    """The Kineto profiler over one CPU call: the ATen ops PyTorch itself recorded (in C++, not
    in any Python object the solution could reach), by schema name.

    ``torch.autograd.profiler.profile`` with Kineto and CPU events only is what
    ``torch.profiler.profile(activities=[CPU])`` runs underneath; called directly because the
    wrapper's ``prepare_trace`` asks ``hasattr(torch, "_inductor")``, which imports Inductor
    (2-7 s of each CPU worker's first call, measured on 2 cores) to read a CUDA-graph flag."""

    def __init__(self) -> None:
        from torch.autograd.profiler import profile

        self._prof = profile(use_cpu=True, use_kineto=True)

    def start(self) -> None:
        self._prof.__enter__()

    def stop(self) -> Counter:
        self._prof.__exit__(None, None, None)
        seen: Counter = Counter()
        for e in self._prof.kineto_results.events():
            name = e.name()
            if name.startswith("aten::"):
                seen[name] += 1
        return seen


def _profiled_log(seen: Counter) -> ops.OpLog:
    log = ops.OpLog()
    log.ops.update(seen)
    return log


class Guard:
    """Monitors of one worker process. ``trusted`` (the task's reference) disables them."""

    def __init__(self, device: str, solution_path: str, task, reference, trusted: bool):
        self.device = device
        self.solution_path = str(solution_path)
        self.task = task
        self.reference = reference
        self.trusted = trusted
        self.extra_forbidden = frozenset(task.spec.forbidden.aten_ops)
        self.audit = None
        self.launches: Launches | None = None
        self.snapshot: dict[str, tuple] = {}
        self.threads0: set[int] = set()
        self.l2_0: int | None = None
        self.signatures: dict[int, list[Counter]] = {}
        self._stash_state: dict = {}
        self.graph_payload: dict = {}

    # ------------------------------------------------------------------ install / import
    def install(self) -> None:
        """Warm up lazy imports, then install every monitor and snapshot identities (call before
        importing the solution); arms the audit hook for the import."""
        if self.trusted:
            return
        import importlib

        import torch
        import torch.profiler  # noqa: F401
        import torch.utils._python_dispatch  # noqa: F401

        for modname in HARNESS_MODULES:  # imported lazily by the worker: import now so the snapshot covers them
            importlib.import_module(modname)

        protected = [str(Path(__file__).resolve().parents[1]), str(Path(self.task.root).resolve())]
        import site
        import sysconfig

        protected += [p for p in {*getattr(site, "getsitepackages", lambda: [])(), sysconfig.get_paths()["purelib"],
                                  sysconfig.get_paths()["stdlib"]} if p]
        self.audit = audit.install(self.solution_path, protected)
        self.launches = Launches()
        self._wrap_entry_points()
        self._wrap_host_access()
        self.snapshot = self._take_snapshot()
        self.threads0 = {t.ident for t in threading.enumerate()} | set(_alive_thread_ids())
        if self.device == "cuda":
            torch.cuda.init()  # the probe needs a live context
            self.l2_0 = gpu.persisting_l2_limit()
        self.audit.arm()

    def _wrap_entry_points(self) -> None:
        rec = self.audit.record
        sol = self.solution_path

        for dotted in ENTRY_POINTS:
            owner_name, attr = dotted.rsplit(".", 1)
            # Only modules already loaded: importing torch._dynamo here would cost seconds per
            # worker, and a solution's own import of an unloaded one is refused by the audit
            # hook (audit.FORBIDDEN_IMPORTS) before any of its functions can be reached.
            owner = _resolve(owner_name, import_missing=False)
            target = getattr(owner, attr, None) if owner is not None else None
            if target is None or getattr(target, "_d2k_wrapped", False):
                continue

            def wrapper(*args, _d2k_name=dotted, _d2k_target=target, **kwargs):
                where = audit.solution_caller(sol, 2)  # PyTorch's own internal uses stay allowed
                if where is not None:
                    rec("forbidden_library", f"{_d2k_name}() called from {where}")
                    raise PermissionError(f"d2k integrity: {_d2k_name} is not allowed in a solution")
                return _d2k_target(*args, **kwargs)

            wrapper._d2k_wrapped = True  # type: ignore[attr-defined]
            wrapper.__doc__ = getattr(target, "__doc__", None)
            try:
                setattr(owner, attr, wrapper)
            except (AttributeError, TypeError):
                continue

    def _wrap_host_access(self) -> None:
        """Refuse the ways host code reaches tensor data (:data:`HOST_ACCESS`) when the solution
        calls them (rule ``host_compute``): the work must be done by Triton kernels, on the CPU
        too, where a tensor's memory is the host's. Triton's interpreter and PyTorch's own
        internal uses stay allowed (the caller decides, as for the entry points)."""
        rec = self.audit.record
        sol = self.solution_path
        for dotted in HOST_ACCESS:
            owner_name, attr = dotted.rsplit(".", 1)
            owner = _resolve(owner_name, import_missing=False)
            target = getattr(owner, attr, None) if owner is not None else None  # inherited methods too
            if target is None or getattr(target, "_d2k_wrapped", False):
                continue

            def wrapper(*args, _d2k_name=dotted, _d2k_target=target, **kwargs):
                where = audit.solution_caller(sol, 2)
                if where is not None:
                    rec("host_compute", f"{_d2k_name}() called from {where}: tensor data read on the host")
                    raise PermissionError(f"d2k integrity: {_d2k_name} is not allowed in a solution "
                                          "(the work must run in Triton kernels)")
                return _d2k_target(*args, **kwargs)

            wrapper._d2k_wrapped = True  # type: ignore[attr-defined]
            wrapper.__doc__ = getattr(target, "__doc__", None)
            wrapper.__name__ = attr
            try:
                setattr(owner, attr, wrapper)
            except (AttributeError, TypeError):
                continue

    def _names(self) -> list[str]:
        import sys

        names = list(CRITICAL) + list(ENTRY_POINTS) + list(HOST_ACCESS)
        for modname in HARNESS_MODULES:
            mod = sys.modules.get(modname)
            if mod is None:
                continue
            for k, v in vars(mod).items():
                if getattr(v, "__module__", None) == modname and callable(v):
                    names.append(f"{modname}.{k}")
                    if isinstance(v, type):
                        names += [f"{modname}.{k}.{m}" for m, f in vars(v).items()
                                  if callable(f) or isinstance(f, (staticmethod, classmethod, property))]
        if self.reference is not None:
            names += ["d2k_task_reference.make_inputs", "d2k_task_reference.run"]
        return names

    def _take_snapshot(self) -> dict[str, tuple]:
        import sys

        snap = {}
        for name in self._names():
            obj = _resolve(name, import_missing=False)
            if obj is not None:
                snap[name] = _fingerprint(obj)
        for modname in ("time", "torch", "torch.cuda", "numpy", "triton", "multiprocessing.connection", *HARNESS_MODULES,
                        "d2k_task_reference"):
            if modname in sys.modules:
                snap[f"sys.modules[{modname!r}]"] = (id(sys.modules[modname]),)
        return snap

    def after_import(self) -> list[dict]:
        """Findings of the import (disarms the audit hook)."""
        if self.trusted:
            return []
        self.audit.disarm()
        return self._common("import")

    # ------------------------------------------------------------------ checks shared by phases
    def _common(self, phase: str) -> list[dict]:
        import sys

        out = []
        changed = []
        for name, fp in self.snapshot.items():
            if name.startswith("sys.modules["):
                modname = name[len("sys.modules['"):-2]
                now = sys.modules.get(modname)
                if now is None or (id(now),) != fp:
                    changed.append(f"{name} was replaced")
                continue
            obj = _resolve(name, import_missing=False)
            if obj is None or _fingerprint(obj) != fp:
                changed.append(f"{name} is now {_describe(obj)}" if obj is not None else f"{name} was deleted")
        if changed:
            out.append({"rule": "monkeypatch", "evidence": f"after {phase}: " + "; ".join(changed[:6])
                        + (f" (+{len(changed) - 6} more)" if len(changed) > 6 else "")})
        extra = [t for t in threading.enumerate() if t.ident not in self.threads0 and t.is_alive() and not _infra(t)]
        known = {t.ident for t in threading.enumerate()}
        raw = {tid: f for tid, f in _alive_thread_ids().items() if tid not in self.threads0 and tid not in known}
        if extra or raw:
            desc = [f"{t.name} (target {getattr(getattr(t, '_target', None), '__qualname__', '?')})" for t in extra[:4]]
            desc += [f"thread {tid} started outside threading, now at "
                     f"{Path(f.f_code.co_filename).name}:{f.f_lineno} ({f.f_code.co_name})" for tid, f in list(raw.items())[:4]]
            out.append({"rule": "background_thread", "evidence": f"after {phase}: {len(extra) + len(raw)} thread(s) "
                                                                 f"still alive: {', '.join(desc)}"})
        if self.device == "cuda" and self.l2_0 is not None:
            now = gpu.persisting_l2_limit()
            if now is not None and now > self.l2_0:
                out.append({"rule": "l2_persistence", "evidence": f"after {phase}: persisting-L2 set-aside grew from "
                                                                  f"{self.l2_0} to {now} bytes"})
        seen = set()
        for rule, ev in self.audit.drain():
            if (rule, ev) not in seen:
                seen.add((rule, ev))
                out.append({"rule": rule, "evidence": ev})
        return out

    def drain(self) -> list[dict]:
        """Disarm and return every pending finding (for an error answer)."""
        if self.trusted or self.audit is None:
            return []
        self.audit.disarm()
        return self._common("error")

    # ------------------------------------------------------------------ correctness calls
    @contextlib.contextmanager
    def call(self, profile: bool = False):
        """Context of one correctness call: dispatch monitor, launch count, armed audit hook,
        and with ``profile`` on the CPU the profiler's own list of the ATen ops that ran (kept by
        PyTorch in C++, out of the monitor's reach: the backstop of the dispatch monitor).
        Yields a dict that holds the call's findings after the block (``["violations"]``)."""
        info: dict = {"violations": []}
        if self.trusted:
            yield info
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        mode, log = ops.make_op_monitor()
        self.launches.take()
        prof = _CpuOpProfile() if profile and self.device == "cpu" else None
        self.audit.arm()
        try:
            if prof is not None:
                prof.start()
            with mode:
                try:
                    yield info
                except BaseException:
                    info["raised"] = True
                    raise
                finally:
                    stack = _get_current_dispatch_mode_stack()
                    info["mode_ok"] = bool(stack) and stack[-1] is mode
        finally:
            seen_by_profiler = prof.stop() if prof is not None else None
            self.audit.disarm()
            v = [{"rule": r, "evidence": e} for r, e in ops.judge(log.ops, self.extra_forbidden)]
            v += [{"rule": r, "evidence": e} for r, e in ops.judge_host(log)]
            if seen_by_profiler is not None:
                v += [{"rule": r, "evidence": e + " (seen by the profiler)"}
                      for r, e in ops.judge(seen_by_profiler, self.extra_forbidden) if not any(x["rule"] == r for x in v)]
                v += [{"rule": r, "evidence": e + " (seen by the profiler)"}
                      for r, e in ops.judge_host(_profiled_log(seen_by_profiler)) if not any(x["rule"] == r for x in v)]
            launched = self.launches.take()
            if not sum(launched.values()) and not info.get("raised"):
                v.append({"rule": "no_triton_launch", "evidence": "the call launched no Triton kernel "
                          f"(ATen ops seen: {', '.join(sorted(log.ops))[:160] or 'none'})"})
            if not info.get("mode_ok", True):
                v.append({"rule": "dispatch_mode_tampered", "evidence": "the harness's TorchDispatchMode was no "
                          "longer on top of the mode stack when run() returned"})
            info["violations"] = v + self._common("call")
            info["launches"] = dict(Launches.names(launched))

    # ------------------------------------------------------------------ timing
    def timed(self, fn: Callable[[int], object], mode: str, stash_seed: int | None) -> Callable[[int], object]:
        """Wrap the timing loop's ``call(i)``: each timed call runs under the same dispatch
        monitor as a correctness call (so that checked and timed calls cannot be told apart by
        the mode stack, and PyTorch compute in timed calls is seen), with per-call launch
        signatures (kernels and grids) per input set, a check that no output reuses the storage
        of an output the harness still holds (the previous call's, the reservoir's), and a
        reservoir of timed outputs (references only, no copies inside the timed window)."""
        if self.trusted:
            return fn
        self.signatures = {}
        rng = random.Random(stash_seed)
        launches = self.launches
        state: dict = {"n": 0, "random": None, "last": None, "prev": None, "reuse": None}
        sigs = self.signatures
        self._stash_state = state
        monitor, log = ops.make_op_monitor()
        self._timed_log = log
        eager = mode != "graph"

        def call(i: int):
            launches.take()
            with monitor:
                out = fn(i)
            sigs.setdefault(i, []).append(launches.take())
            if eager:
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                if state["reuse"] is None:
                    held = [x for item in (state["prev"], state["random"]) if item is not None
                            for x in storage_spans(item[2] if isinstance(item[2], (tuple, list)) else [item[2]])]
                    hit = overlapping(storage_spans(outs), held)
                    if hit is not None:
                        state["reuse"] = f"timed call {state['n'] + 1} on input set {i} returned storage " \
                                         f"[{hit[0]:#x}, {hit[1]:#x}) that an earlier call's output still holds"
                state["prev"] = (i, 0, out)
            if eager and stash_seed is not None:
                n = state["n"] = state["n"] + 1
                if rng.random() < 1.0 / n:  # reservoir sample: one uniformly random call ...
                    state["random"] = (i, n, out)
                state["last"] = (i, n, out)  # ... and always the last one
            elif eager:
                state["n"] += 1
            return out

        self.audit.arm()
        return call

    def after_timing(self, msg: dict, run: Callable, make_args: Callable[[int], list], flush, timed_mean_ms: float | None,
                     package: Callable[[object, list], dict]) -> dict:
        """Findings and payloads after the timing loop (the answer's extra fields).

        Args:
            msg: the ``time`` request (``integrity``: ``profile_seeds``, ``stash_seed``, ...).
            run: the solution's ``run``; ``make_args(seed)``: inputs of one fresh call.
            flush: the L2 flush of events mode (None elsewhere).
            timed_mean_ms: the timed mean, for the fresh-call consistency check.
            package: ``package(result, args)`` -> the fields of an ``outputs`` answer.
        """
        if self.trusted:
            return {}
        self.audit.disarm()
        violations = self._common("timing")
        log = getattr(self, "_timed_log", None)
        if log is not None:
            violations += [{"rule": r, "evidence": e.replace("run()", "timed calls of run()", 1)}
                           for r, e in ops.judge(log.ops, self.extra_forbidden)]
            self._timed_log = None
        reuse = (getattr(self, "_stash_state", None) or {}).get("reuse")
        if reuse:
            violations.append({"rule": "output_reuse", "evidence": reuse})
        for i, calls in sorted(self.signatures.items()):
            sigs = [tuple(sorted(c.items())) for c in calls]
            if len(set(sigs)) > 1:
                common = Counter(sigs).most_common(1)[0][0]
                odd = [s for s in sigs if s != common]
                violations.append({"rule": "launch_mismatch", "evidence": f"timed calls on input set {i} launched "
                                   f"different Triton kernels or grids: usually {describe_launches(Counter(dict(common)))}, "
                                   f"once {describe_launches(Counter(dict(odd[0])))}"})
                break
        for i, calls in sorted(self.signatures.items()):
            empty = sum(1 for c in calls if not sum(c.values()))
            if empty:
                violations.append({"rule": "no_triton_launch", "evidence": f"{empty} of {len(calls)} timed calls on "
                                   f"input set {i} launched no Triton kernel"})
                break
        extra: dict = {}
        stashed = []
        state = getattr(self, "_stash_state", None) or {}
        picks = [state.get("random"), state.get("last")]
        for k, item in enumerate(picks):
            if item is not None and (k == 0 or item is not picks[0]):
                i, n, out = item
                stashed.append({"set": i, "ordinal": n, **package(out, [])})
        self._stash_state = {}
        if stashed:
            extra["stashed"] = stashed
        integ = msg.get("integrity") or {}
        if self.device == "cuda" and integ.get("profile_seeds"):
            self.audit.arm()
            try:
                fresh = [make_args(s) for s in integ["profile_seeds"]]
                calls = [(lambda a=a: run(*a)) for a in fresh]
                kernels, windows, names = gpu.profile_calls(calls, flush,
                                                            lambda: set(Launches.names(self.launches.take())))
            finally:
                self.audit.disarm()
            findings, summary = gpu.analyse(kernels, windows, names, timed_mean_ms)
            violations += [{"rule": r, "evidence": e} for r, e in findings]
            extra["profile"] = summary
            gp = self.graph_payload
            if gp.get("replay_kernels") is not None:  # graph vs eager: Triton launches per eager call
                per_call = [Counter(k.name for k in kernels if w.start_ns <= k.start_ns <= w.end_ns
                                    and gpu.kernel_class(k.name, k.kind, names) == "triton") for w in windows]
                eager = {n: min(c.get(n, 0) for c in per_call) for n in names} if per_call else {}
                for r, e in gpu.compare_graph(gp["replay_kernels"], eager, gp["calls"], names):
                    violations.append({"rule": r, "evidence": e})
            violations += self._common("profiling")
        if self.graph_payload.get("verify"):
            extra["graph_verify"] = self.graph_payload["verify"]
        self.graph_payload = {}
        extra["violations"] = violations
        return extra

    # ------------------------------------------------------------------ CUDA graphs
    def graph_hooks(self, sets: list, fresh_args: Callable[[], list] | None,
                    package: Callable[[object, list], dict]) -> tuple[Callable[[], None], Callable]:
        """``(before_replay, after_replays)`` for :func:`d2kbench.harness.timing.time_graph`.

        ``before_replay`` changes one random element of every floating-point input of set 0 (a
        new position and value every replay; inside the argument's ``value_range`` where the
        spec bounds it), so a graph that gates its work on a checksum of (part of) its inputs
        cannot skip the work, and a small parameter tensor (three temperatures beside thousands
        of logits) changes on every replay too (one argument chosen per replay could leave it
        unchanged through a whole timing run). ``after_replays(graph, keep, calls)`` (``keep``:
        each set's outputs of the graph's last pass over the sets, ``calls``: captured calls per
        replay) (1) profiles one
        replay for the kernel comparison, (2) packages set 0's inputs and outputs of the last
        timed replay, (3) rewrites set 0 with fresh inputs, poisons its outputs with NaN,
        replays once more and packages the result; the parent checks both.
        """
        import torch

        if self.trusted:
            return None, None
        rng = random.Random()
        from d2kbench.checking.inputs import arg_tensors, clone_args

        # each floating-point tensor of set 0 (tensor-list elements included) with its spec's value_range
        bounded = [(t, spec.value_range) for a, spec in zip(sets[0], self.task.spec.args)
                   for t in arg_tensors([a]) if isinstance(spec, TensorArg)]
        float_args = [(t, b) for t, b in bounded if t.is_floating_point() and t.numel() and t.is_contiguous()]
        scales = [ops.finite_abs_max(a) for a, _ in float_args]  # once: no reduction or sync per replay
        # a new value stays finite in the argument's dtype (e4m3 has no Inf: 2 x its largest code is NaN)
        limits = [float(torch.finfo(a.dtype).max) for a, _ in float_args]

        def before_replay() -> None:
            for k, (arg, bounds) in enumerate(float_args):
                t = arg.view(-1)
                t[rng.randrange(t.numel())] = rng.uniform(*bounds) if bounds is not None else \
                    rng.choice((-1.0, 1.0)) * min(scales[k] * rng.uniform(0.5, 2.0), limits[k])

        def after_replays(graph, keep, calls: int) -> None:
            payload: dict = {"calls": calls}
            if self.device == "cuda" and not self.trusted:
                payload["replay_kernels"] = gpu.profile_replay(graph.replay)
            torch.cuda.synchronize()
            last = {**package(keep[0], sets[0]), "args": clone_args(sets[0])}
            # set 0 runs this many times per replay: a state update (an in-place residual) is applied as often
            verify = {"last_replay": last, "passes": max(1, calls // max(1, len(sets)))}
            if fresh_args is not None:
                fresh = fresh_args()
                same_scalars = all(isinstance(a, (torch.Tensor, list)) or a == b for a, b in zip(sets[0], fresh))
                if same_scalars:
                    for dst, src in zip(arg_tensors(sets[0]), arg_tensors(fresh)):
                        dst.copy_(src)
                    outs = list(keep[0]) if isinstance(keep[0], (tuple, list)) else [keep[0]]
                    for o in outs:
                        if isinstance(o, torch.Tensor):
                            o.fill_(float("nan") if o.is_floating_point() else -1)
                    graph.replay()
                    torch.cuda.synchronize()
                    verify["fresh"] = {**package(keep[0], sets[0]),
                                       "args": clone_args(sets[0])}
            payload["verify"] = verify
            self.graph_payload = payload

        return before_replay, after_replays


def package(result, args: list) -> dict:
    """The fields of an ``outputs`` answer for ``result`` (as ``Worker.do_call`` sends them):
    outputs cloned into worker-owned memory, their types, exactness and aliasing with ``args``."""
    import torch

    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    exact = [type(o) is torch.Tensor for o in outs]
    return {
        "outputs": [o.detach().clone() if ok else None for o, ok in zip(outs, exact)],
        "types": [f"{type(o).__module__}.{type(o).__qualname__}" for o in outs],
        "exact_tensor": exact,
        "subclass": [issubclass(type(o), torch.Tensor) and not ok for o, ok in zip(outs, exact)],
        "container": type(result).__name__,
        "aliases": find_aliases([o for o, ok in zip(outs, exact) if ok], args),
        "strides": [list(o.stride()) if ok else None for o, ok in zip(outs, exact)],  # the clone may re-lay out
    }
