"""The worker process: the only place where a solution's code runs.

The trusted parent (:mod:`d2kbench.harness.evaluate`) spawns one worker per solution and
talks to it over a pipe. Tensors cross through torch.multiprocessing (CUDA IPC on the GPU,
shared memory on the CPU). The worker never sees expected outputs or the seeds of the
correctness calls' checks; it only runs calls and timing loops and reports what it saw.

Messages (dicts with an ``op``) from the parent: ``call`` (args), ``time`` (workload, seeds,
mode), ``exit``. Answers carry a ``kind``: ``ready``, ``outputs``, ``timing``, ``error``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

from d2kbench.checking.aliases import find_aliases

# Imports inside functions: the worker's start-up is measured step by step (torch, task, guard, solution), and the
# guard must be installed before the solution is imported.

#: Module name under which the worker imports the task's ``reference.py`` (before the solution);
#: :mod:`d2kbench.harness.compiled_reference` finds the reference to compile under it.
REFERENCE_MODULE = "d2k_task_reference"
#: Exception class names that mean the solution did not compile.
_COMPILE_ERRORS = {"CompilationError", "CompileTimeAssertionFailure", "UnsupportedLanguageConstruct", "SyntaxError",
                   "IndentationError"}


def classify(exc: BaseException) -> str:
    """Map an exception raised by solution code to a status value."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "OutOfMemoryError" in names or isinstance(exc, MemoryError):
        return "oom"
    if names & _COMPILE_ERRORS:
        return "compile_error"
    msg = str(exc).lower()
    if "out of memory" in msg or "can't allocate memory" in msg or "not enough memory" in msg:
        return "oom"  # CUDA OOM raised as RuntimeError by some paths; the CPU allocator's message
    return "runtime_error"


def describe(exc: BaseException, solution_path: str | None = None, limit: int = 1200) -> str:
    """``Type: message`` plus the innermost frame in the solution file, if any."""
    text = f"{type(exc).__name__}: {exc}".strip()
    frames = traceback.extract_tb(exc.__traceback__)
    if solution_path:
        own = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(solution_path)]
        if own:
            f = own[-1]
            text += f" (at {Path(f.filename).name}:{f.lineno}: {f.line})"
    return text[:limit]


def poison_uninitialized_memory(torch, on: bool) -> None:
    """Switch PyTorch's deterministic mode, in which newly allocated memory (``torch.empty`` and
    friends) is filled with NaN (floats) or the largest integer, so that an output a solution
    never writes fails the checks (``torch.utils.deterministic.fill_uninitialized_memory``).

    Calls the C switch that ``torch.use_deterministic_algorithms`` wraps: the Python function
    also imports ``torch._inductor`` (2-6 s per worker, measured) only to set an Inductor flag."""
    torch._C._set_deterministic_fill_uninitialized_memory(True)
    torch._C._set_deterministic_algorithms(on, warn_only=on)


@contextlib.contextmanager
def timed_call_state(torch, untrusted: bool):
    """The global state of timed calls of an untrusted solution: deterministic mode on, as in
    its correctness calls (``torch.are_deterministic_algorithms_enabled()`` cannot tell the two
    apart), but without filling new memory (a fill kernel per allocation would be timed). Glue
    ops, the only PyTorch ops a solution may run, have no nondeterministic variants, so their
    speed is unchanged; trusted code (the reference, alternatives) is timed as it is."""
    if not untrusted:
        yield
        return
    torch._C._set_deterministic_fill_uninitialized_memory(False)
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch._C._set_deterministic_algorithms(False, warn_only=False)
        torch._C._set_deterministic_fill_uninitialized_memory(True)


class Worker:
    """State of one worker process (solution module, task, device)."""

    def __init__(self, conn, task_root: str, solution_path: str, device: str, options: dict):
        self.conn = conn
        self.task_root = task_root
        self.solution_path = solution_path
        self.device = device
        self.options = options
        self.pending: list = []  # outputs sent to the parent, kept alive until its next message
        self.nonce = None  # the current request's nonce, echoed in the answer (forgery check)
        self.guard = None  # d2kbench.integrity.guard.Guard, installed before the solution is imported
        self.findings: list[dict] = []  # integrity findings not yet sent
        self.held: list = []  # original outputs of the last correctness calls (storage-reuse check)

    def send(self, msg: dict) -> None:
        self.conn.send({**msg, "nonce": self.nonce})

    def error(self, status: str, cause: str, violations: list[dict] | None = None) -> None:
        v = self.findings + list(violations or [])
        self.findings = []
        # e.g. a PermissionError raised by the integrity audit hook, at a call or at the import
        if v and status in ("runtime_error", "compile_error"):
            status, cause = "integrity_violation", f"{v[0]['rule']}: {v[0]['evidence']} ({cause})"
        self.send({"kind": "error", "status": status, "cause": cause, "violations": v})

    def load(self) -> bool:
        marks = [("process_start", time.time() - float(self.options.get("spawned_at", time.time())))]
        t = time.perf_counter()

        def mark(name: str) -> None:
            nonlocal t
            now = time.perf_counter()
            marks.append((name, now - t))
            t = now

        import torch

        from d2kbench.tasks.loader import import_file, load_task

        self.torch = torch
        mark("import_torch")
        if self.device == "cuda":
            torch.cuda.set_device(0)
            torch.cuda.init()
        mark("cuda_init")
        self.task = load_task(self.task_root)
        self.reference = import_file(Path(self.task_root) / "reference.py", REFERENCE_MODULE)
        from d2kbench.integrity.guard import Guard

        self.guard = Guard(self.device, self.solution_path, self.task, self.reference,
                           trusted=bool(self.options.get("trusted")) or not self.options.get("integrity", True))
        self.guard.install()  # audit hook, launch counter, identity snapshot; armed for the import
        mark("task_and_guard")
        # the solution's own folder (a staged copy of exactly the reviewed files) for its sibling modules
        sys.path.insert(0, str(Path(self.solution_path).parent))
        try:
            module = import_file(Path(self.solution_path), "d2k_solution")
            mark("solution_import")
            self.findings = self.guard.after_import()
        except BaseException as e:  # noqa: BLE001 - any failure of untrusted code is reported
            self.findings = self.guard.after_import()
            status = "compile_error" if classify(e) in ("compile_error", "runtime_error") else classify(e)
            self.error(status, "import failed: " + describe(e, self.solution_path))
            return False
        run = getattr(module, "run", None)
        if not callable(run):
            self.error("compile_error", f"{Path(self.solution_path).name} defines no callable run()")
            return False
        self.run = run
        self.send({"kind": "ready", "pid": os.getpid(), "startup_s": dict(marks),  # seconds, diagnostics
                   "process_filter": self.options.get("process_filter", "")})
        return True

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def do_call(self, args: list, unpack_s: float = 0.0) -> None:
        torch = self.torch
        poison_uninitialized_memory(torch, True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_in = time.perf_counter()
                with self.guard.call(profile=True) as info:  # dispatch monitor, launches, audit hook, CPU profiler
                    t0 = time.perf_counter()
                    result = self.run(*args)
                    self.sync()
                    wall = time.perf_counter() - t0
                guard_s = time.perf_counter() - t_in - wall
        except BaseException as e:  # noqa: BLE001
            self.error(classify(e), describe(e, self.solution_path), info.get("violations") if "info" in locals() else None)
            return
        finally:
            poison_uninitialized_memory(torch, False)
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        types = [f"{type(o).__module__}.{type(o).__qualname__}" for o in outs]
        exact = [type(o) is torch.Tensor for o in outs]
        subclass = [issubclass(type(o), torch.Tensor) and not ok for o, ok in zip(outs, exact)]
        aliases = find_aliases([o for o, ok in zip(outs, exact) if ok], args)
        reused = self._reused_storage([o for o, ok in zip(outs, exact) if ok])
        # Clone into worker-owned memory: the parent receives storage no input shares.
        t_pack = time.perf_counter()
        sent = [o.detach().clone() if ok else None for o, ok in zip(outs, exact)]
        self.sync()
        self.pending = sent
        self.send({
            "kind": "outputs", "outputs": sent, "types": types, "exact_tensor": exact, "subclass": subclass,
            "container": type(result).__name__, "aliases": aliases, "wall_s": wall,
            "strides": [list(o.stride()) if ok else None for o, ok in zip(outs, exact)],  # the clone may re-lay out
            "violations": self.findings + info["violations"] + reused,
            "phases": {"unpack": unpack_s, "run": wall, "guard": guard_s,  # seconds, diagnostics
                       "pack": time.perf_counter() - t_pack},
        })
        self.findings = []

    def _reused_storage(self, outs: list) -> list[dict]:
        """``output_reuse`` when an output's storage overlaps an output of one of the last
        correctness calls, which this worker still holds: a fresh allocation never does, so the
        solution returned memory it keeps across calls. Holds ``outs`` for the next calls."""
        from d2kbench.integrity.guard import overlapping, storage_spans

        if self.guard is None or self.guard.trusted:
            return []
        hit = overlapping(storage_spans(outs), [sp for held in self.held for sp in storage_spans(held)])
        self.held = (self.held + [outs])[-4:]
        if hit is None:
            return []
        return [{"rule": "output_reuse", "evidence": f"an output's storage [{hit[0]:#x}, {hit[1]:#x}) is also the "
                 "storage of an earlier call's output, which the harness still holds: the solution returns "
                 "memory it keeps across calls"}]

    def do_time(self, msg: dict) -> None:
        from d2kbench.checking.inputs import args_nbytes, make_args
        from d2kbench.harness import timing

        torch = self.torch
        spec = self.task.spec
        workload = spec.workload(msg["workload"])
        seeds = msg["seeds"]
        mode = msg["mode"]
        t0 = time.perf_counter()
        first = make_args(self.reference, spec, workload, seeds[0], self.device)
        if mode == "graph":
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            n_sets = int(min(len(seeds), max(1, -(-3 * l2 // max(1, args_nbytes(first))))))
        else:
            n_sets = min(len(seeds), 2)
        sets = [first] + [make_args(self.reference, spec, workload, s, self.device) for s in seeds[1:n_sets]]
        self.sync()
        t1 = time.perf_counter()

        def call(i: int):
            return self.run(*sets[i])

        from d2kbench.integrity.guard import package

        integ = msg.get("integrity") or {}
        call = self.guard.timed(call, mode, integ.get("stash_seed"))  # launch signatures, kept outputs
        flush = None
        fresh = (lambda: make_args(self.reference, spec, workload, integ["verify_seed"], self.device)) \
            if integ.get("verify_seed") is not None else None
        try:
            with warnings.catch_warnings(), timed_call_state(torch, not self.guard.trusted):
                warnings.simplefilter("ignore")
                if mode == "cpu":
                    stats = timing.time_cpu(call, n_sets, samples=int(msg.get("cpu_samples", 3)))
                elif mode == "graph":
                    before, after = self.guard.graph_hooks(sets, fresh, package)
                    stats = timing.time_graph(call, n_sets, **msg.get("params", {}), before_replay=before,
                                              after_replays=after)
                else:
                    l2 = torch.cuda.get_device_properties(0).L2_cache_size
                    flush_buf = torch.empty(max(2 * l2, 128 << 20), dtype=torch.uint8, device="cuda")
                    flush = flush_buf.zero_
                    stats = timing.time_events(call, n_sets, flush=flush, **msg.get("params", {}))
                if self.device == "cuda":  # one more call, like the timed ones: its peak memory
                    from d2kbench.harness.memory import CudaAllocatorStats, measure_call

                    _, mem = measure_call(lambda: call(0), CudaAllocatorStats())
                    stats = stats.model_copy(update={"peak_mem_bytes": mem.peak_bytes,
                                                     "output_mem_bytes": mem.output_bytes})
            t2 = time.perf_counter()
            extra = self.guard.after_timing(msg, self.run, lambda s: make_args(self.reference, spec, workload, s,
                                                                                self.device), flush, stats.mean_ms, package)
        except BaseException as e:  # noqa: BLE001
            self.error(classify(e), "during timing: " + describe(e, self.solution_path), self.guard.drain())
            return
        sampled = sum(stats.samples_ms) * stats.calls_per_sample / 1e3
        phases = {"inputs": t1 - t0, "samples": sampled, "warmup": max(0.0, t2 - t1 - sampled),
                  "integrity": time.perf_counter() - t2}  # seconds; the parent's breakdown of the request
        self.send({"kind": "timing", "stats": stats.model_dump(), **extra, "phases": phases})

    def serve(self) -> None:
        if not self.load():
            return
        while True:
            try:
                self.conn.poll(None)  # wait for the next request (not counted)
                t_unpack = time.perf_counter()
                msg = self.conn.recv()  # unpickling rebuilds the args (CUDA IPC handles opened here)
                unpack_s = time.perf_counter() - t_unpack
            except EOFError:
                return
            self.pending = []
            self.nonce = msg.get("nonce") if isinstance(msg, dict) else None
            op = msg.get("op")
            if op == "call":
                self.do_call(msg["args"], unpack_s)
            elif op == "time":
                self.do_time(msg)
                if self.device == "cuda":  # give the timing sets' memory back for the parent and other workers
                    self.torch.cuda.empty_cache()
            elif op == "exit":
                self.send({"kind": "bye"})
                return
            else:
                self.error("runtime_error", f"unknown op {op!r}")


def worker_main(conn, task_root: str, solution_path: str, device: str, options: dict) -> None:
    """Serve the parent's requests until ``exit`` (started by :mod:`d2kbench.harness.worker_boot`).

    The working directory is the worker's private folder (the sandbox's only writable place
    besides its compile cache); stdout and stderr already go to the log the parent quotes."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from d2kbench.harness import interpreter_numerics

        interpreter_numerics.install()  # float conversions and tl.fma as on sm_90 (docs/cpu.md)
    # the solution's prints reach the log line by line, also when the worker is killed
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    with contextlib.suppress(BrokenPipeError, EOFError, ConnectionResetError):
        Worker(conn, task_root, solution_path, device, options).serve()
