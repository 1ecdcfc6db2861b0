"""The integrity rules: one name per defence, what it catches, and which cheats of the catalogue
(the catalogue of ``docs/integrity.md``: entries 1-33 from the literature of reward hacking in
kernel benchmarks, 34-47 the attacks on the trust boundary itself) it answers.

A violated rule is recorded as a :class:`~d2kbench.results.Violation` (``rule`` is one
of the names below, ``evidence`` says what was seen) and gives the workload the status
``integrity_violation``. Rules whose name starts with ``ast_`` come from the static analysis of
the solution's source (:mod:`d2kbench.integrity.static`); the others are observed at run time,
in the worker (:mod:`d2kbench.integrity.guard`) or in the trusted parent
(:mod:`d2kbench.integrity.parent`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One integrity rule. ``where``: ``parent`` (trusted process), ``worker`` (tamper-evident
    monitors next to the solution), ``static`` (source analysis) or ``gpu`` (profiler, GPU only)."""

    name: str
    where: str
    catalogue: tuple[int, ...]
    summary: str


_RULES = [
    # --- implementation: the solution's own Triton kernels do the work --------------------
    Rule("forbidden_op", "worker", (24, 28, 29, 30),
         "a vendor-library ATen op (matmul/@/einsum/bmm/mm/addmm/baddbmm, SDPA, convolution, linalg "
         "decompositions, the task's forbidden.aten_ops) ran inside run(); seen by a TorchDispatchMode"),
    Rule("torch_compute", "worker", (24, 28, 29, 30),
         "a PyTorch compute op that is not glue (allocation, views, layout/dtype copies, fills) ran "
         "inside run(); the timed computation must be in the solution's Triton kernels"),
    Rule("no_triton_launch", "worker", (24, 28, 30),
         "a call of run() launched no Triton kernel (launch-counting hook on JITFunction.run and the "
         "interpreter's InterpretedFunction.run, so it works under TRITON_INTERPRET=1 too)"),
    Rule("launch_mismatch", "worker", (9, 13, 41),
         "timed calls on the same input set launched different Triton kernels or the same kernels on "
         "different grids (a cache hit launches fewer or smaller kernels than the call that filled the cache)"),
    Rule("forbidden_library", "worker", (30,),
         "an entry point of a forbidden library was called or imported while the solution ran "
         "(torch.compile / dynamo / inductor, cpp_extension.load_inline, cupy, cuda-python, vendor packages)"),
    Rule("host_compute", "worker", (39, 6, 30, 34),
         "solution code read tensor data on the host (Tensor.numpy/tolist/__array__/__dlpack__, torch.save, "
         "pickling, a process's memory file /proc/<pid>/mem), or one call read more scalars or copied more "
         "bytes GPU-to-host than launch planning needs: the work ran on the host, not in Triton kernels"),
    Rule("dispatch_mode_tampered", "worker", (30,),
         "the harness's TorchDispatchMode was removed from the mode stack during run()"),
    Rule("forbidden_kernel", "gpu", (30,),
         "the profiler saw a vendor kernel (cuBLAS/cuBLASLt nvjet, CUTLASS, cuDNN, flash/fmha, "
         "inductor-generated triton_poi/red/per/tem) in a call of run()"),
    Rule("foreign_kernel", "gpu", (30,),
         "the profiler saw a GPU kernel that is neither one of the solution's Triton kernels nor a "
         "PyTorch glue kernel (e.g. launched through ctypes, CuPy or an inline extension)"),
    Rule("no_triton_kernel", "gpu", (24, 28, 30),
         "the profiler saw none of the solution's Triton kernels in a profiled call"),
    # --- timing --------------------------------------------------------------------------------
    Rule("hidden_work", "gpu", (1, 2),
         "GPU busy time seen by the profiler on all streams exceeds the CUDA-event time by more than "
         "1.3x + 2 us, or kernels ran after run() returned (side streams, deferred work)"),
    Rule("timing_inconsistent", "gpu", (9, 13, 8),
         "the timed mean is below half of the GPU busy time of the same solution on fresh inputs "
         "(the timed calls did less work than real calls)"),
    Rule("background_thread", "worker", (2, 38),
         "a Python thread started by the solution was still alive after run() returned or after timing "
         "(threads started outside the threading module included: every interpreter thread state counts)"),
    Rule("child_process", "parent", (35, 12, 32),
         "a process started by the solution was still running after run() returned (seen by the parent "
         "in the worker's sandbox, from outside it)"),
    Rule("output_reuse", "worker", (42, 13, 26),
         "an output's storage overlaps an output of an earlier call that the harness still holds: the "
         "solution returns memory it keeps across calls (checked on every correctness and timed call)"),
    Rule("monkeypatch", "worker", (4, 5, 31),
         "a function or class the harness relies on (timers, torch.cuda events/sync/graphs, the pipe, "
         "the harness's timing/statistics/worker code, builtins, the task's input generator) was "
         "replaced, or its __code__ swapped; snapshotted before the solution was imported"),
    Rule("timed_output", "parent", (24, 26, 33, 9, 13),
         "an output produced during the timing loop (a secretly chosen timed call, and the last one) "
         "failed the task's checks although the correctness calls passed"),
    Rule("graph_replay", "parent", (11,),
         "a CUDA-graph replay on inputs rewritten in place (outputs poisoned with NaN first) did not "
         "produce correct outputs: the graph does not recompute from its inputs"),
    Rule("graph_kernel_mismatch", "gpu", (11,),
         "the captured CUDA graph does not launch the solution's Triton kernels as often as eager calls do"),
    Rule("l2_persistence", "gpu", (10,),
         "the persisting-L2 set-aside (cudaLimitPersistingL2CacheSize) grew while the solution ran"),
    Rule("below_sol_floor", "parent", (5, 6, 7, 4),
         "the measured time is below the task's roofline floor (sol.floor variant at datasheet peaks): "
         "physically impossible, so the timing was forged or the work skipped"),
    # --- results and the process ---------------------------------------------------------------
    Rule("stale_output", "parent", (13,),
         "after one secretly chosen input element changed, the output stayed bit-identical to the "
         "previous call's although the reference output changed (a cache keyed on part of the input)"),
    Rule("exact_tensor_type", "worker", (3,), "an output is a torch.Tensor subclass or proxy, not exactly torch.Tensor"),
    Rule("no_aliasing", "worker", (19,), "an output shares storage with an input"),
    Rule("forged_answer", "parent", (6, 32, 45),
         "the pipe carried an answer the worker protocol did not send (wrong kind or missing the "
         "request's secret nonce), or a frame the parent refused to load (a pickle naming a global "
         "outside its allow-list, a descriptor from a foreign listener), or the parent's resource-sharer "
         "listener refused a request from the worker: someone else wrote to the channels the parent reads"),
    Rule("introspection", "worker", (20, 21, 6, 7, 47),
         "solution code reached for frames, the garbage collector, tracing or audit hooks "
         "(sys._getframe, tb_frame, gc.get_objects, sys.settrace, ...); blocked by an audit hook"),
    Rule("ctypes", "worker", (7, 10, 30, 47), "solution code used ctypes (dlopen/dlsym/foreign calls); blocked by an audit hook"),
    Rule("process_control", "worker", (32, 6, 12, 46),
         "solution code tried to fork, exec, spawn a subprocess or send a signal; blocked by an audit hook, "
         "and on the CPU by the worker's seccomp filter, which kills the worker (SIGSYS, seen by the parent) "
         "at any fork, clone of a process or exec"),
    Rule("harness_tampering", "parent", (31,),
         "a harness, task or installed-package file was opened for writing, renamed or removed by the "
         "solution (blocked by an audit hook), or its content hash changed during the evaluation"),
    # --- static (AST) rules -------------------------------------------------------------------
    Rule("ast_forbidden_call", "static", (28, 30, 24),
         "source calls a forbidden PyTorch operator (matmul, @, einsum, bmm, mm, addmm, baddbmm, linear, "
         "SDPA, linalg, torch.ops.aten...) outside @triton.jit code"),
    Rule("ast_forbidden_import", "static", (30, 2, 6, 7, 31),
         "source imports a forbidden module (ctypes, cffi, cupy, cuda-python, numba, cpp_extension, "
         "inductor/dynamo, vendor kernel packages, threading/multiprocessing/subprocess, gc, inspect, d2kbench)"),
    Rule("ast_compile", "static", (30,), "source uses torch.compile, torch.jit, cpp_extension.load/load_inline"),
    Rule("ast_try_fallback", "static", (28,),
         "an exception handler falls back to PyTorch compute (or any try/except around run's work "
         "whose handler calls torch compute)"),
    Rule("ast_introspection", "static", (20, 21, 5, 6),
         "source touches interpreter internals: sys._getframe, sys.modules, frames, __globals__/__code__/"
         "__closure__, the dispatch-mode stack, torch._C, gc"),
    Rule("ast_monkeypatch", "static", (4, 5, 25, 31),
         "source assigns to an attribute of torch/time/triton/numpy/multiprocessing/builtins/the harness "
         "(e.g. torch.cuda.Event.elapsed_time = ..., torch.backends...allow_tf32 = ...)"),
    Rule("ast_tensor_subclass", "static", (3,),
         "source defines a torch.Tensor subclass or __torch_function__/__torch_dispatch__"),
    Rule("ast_capture_aware", "static", (11,),
         "source inspects CUDA-graph capture (is_current_stream_capturing, CUDAGraph, torch.cuda.graph)"),
    Rule("ast_l2_persistence", "static", (10,),
         "source names the persisting-L2 APIs (access policy window, cudaLimitPersistingL2CacheSize)"),
    Rule("ast_dynamic_code", "static", (29, 30, 31),
         "source runs dynamic code or lookups that defeat static review (exec, eval, compile, "
         "__import__, importlib, getattr on torch with a computed name)"),
    Rule("ast_process_control", "static", (32,), "source calls os._exit, sys.exit, exit, quit, os.kill, os.fork, os.system"),
    Rule("ast_reference_import", "static", (29,), "source imports the task's reference implementation"),
    Rule("ast_host_compute", "static", (39,),
         "host code uses numpy or reads tensor data on the host (.numpy(), .tolist(), torch.from_numpy, "
         "__array__/__dlpack__, .cpu()/.to('cpu')) outside @triton.jit code"),
]

#: Every rule by name.
RULES: dict[str, Rule] = {r.name: r for r in _RULES}


def rule(name: str) -> Rule:
    """The rule called ``name``.

    Raises:
        KeyError: unknown rule name.
    """
    return RULES[name]
