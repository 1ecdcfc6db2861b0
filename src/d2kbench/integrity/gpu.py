"""GPU-side evidence: what the profiler (CUPTI, all streams) saw during calls of ``run``.

The worker profiles a few calls on *fresh* inputs after the timing loop (:func:`profile_calls`):
each call sits in a ``record_function`` window that ends with a device-wide synchronize, so every
kernel the call caused, on any stream, starts inside its window; a short trailing window catches
work launched after ``run`` returned. :func:`analyse` turns kernels and windows into rules:

* ``hidden_work``: GPU busy time (union of kernel intervals, all streams) above
  1.3 x event time + 2 us (docs/timing.md, "Integrity of a timing"), or solution kernels after the last window;
* ``forbidden_kernel`` / ``foreign_kernel`` / ``no_triton_kernel``: kernel names against the
  solution's own Triton kernels (names from the launch hook), PyTorch glue and vendor patterns;
* ``timing_inconsistent``: the timed mean below half of the fresh calls' busy time.

:func:`analyse` is pure (plain records in, findings out) so it is unit-tested on the CPU.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Imports inside functions: torch and its profiler load in the worker, only on the GPU paths.

#: Vendor and compiler-generated kernel names (cuBLAS/cuBLASLt incl. Hopper ``nvjet``, CUTLASS,
#: cuDNN, FlashAttention, cuSOLVER/cuFFT, Inductor's generated Triton kernels).
VENDOR_KERNEL = re.compile(
    r"gemm|gemv|cublas|cutlass|nvjet|xmma|cudnn|flash_|flash::|fmha|sdpa|magma|cusolver|cufft|syevd|gesvd|"
    r"potrf|geqrf|trsm|splitk|cutensor|^sm\d+_|^ampere_|^hopper_|^volta_|^turing_|^blackwell_|"
    r"^triton_(poi|red|per|tem|for|mm|bmm)_", re.I)
#: Namespaces of PyTorch's own kernels (glue: fills, copies, casts); their ATen ops are judged
#: by the dispatch monitor, not here.
TORCH_KERNEL = re.compile(r"at::|at_cuda_detail|c10::|cub::|thrust::|\bat_native|pytorch|Memcpy|Memset|memcpy|memset")
HIDDEN_RATIO = 1.3
HIDDEN_SLACK_MS = 0.002
INCONSISTENT_RATIO = 0.5


@dataclass(frozen=True)
class KernelRecord:
    """One GPU activity: ``kind`` is ``kernel``, ``memcpy`` or ``memset``; times in ns."""

    name: str
    start_ns: int
    end_ns: int
    stream: int = 0
    kind: str = "kernel"


@dataclass(frozen=True)
class Window:
    """One profiled call: CPU-side window (ns, same clock as the kernels) and its event time (ms)."""

    index: int
    start_ns: int
    end_ns: int
    event_ms: float


def kernel_class(name: str, kind: str, triton_names: set[str]) -> str:
    """``triton`` (the solution's), ``glue`` (PyTorch/copies), ``vendor`` or ``foreign``."""
    if kind in ("memcpy", "memset"):
        return "glue"
    base = name.strip()
    for t in triton_names:
        if base == t or base.startswith(t + "_") or base.startswith(t + "(") or base.split("(")[0].endswith(" " + t):
            return "triton"
    if VENDOR_KERNEL.search(base):
        return "vendor"
    if TORCH_KERNEL.search(base):
        return "glue"
    return "foreign"


def busy_ms(kernels: list[KernelRecord]) -> float:
    """Length of the union of the kernels' intervals, in ms (overlaps on several streams merged)."""
    spans = sorted((k.start_ns, k.end_ns) for k in kernels)
    total = 0
    cur: tuple[int, int] | None = None  # (start, end) of the merged interval being grown
    for s, e in spans:
        if cur is None or s > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = (s, e)
        else:
            cur = (cur[0], max(cur[1], e))
    if cur is not None:
        total += cur[1] - cur[0]
    return total / 1e6


def analyse(kernels: list[KernelRecord], windows: list[Window], triton_names: set[str],
            timed_mean_ms: float | None = None) -> tuple[list[tuple[str, str]], dict]:
    """Findings ``(rule, evidence)`` and a summary dict from one profiling session."""
    findings: list[tuple[str, str]] = []
    per_call, busy = [], []
    windows = sorted(windows, key=lambda w: w.start_ns)
    for w in windows:
        inside = [k for k in kernels if w.start_ns <= k.start_ns <= w.end_ns]
        b = busy_ms(inside)
        busy.append(b)
        classes: dict[str, list[str]] = {}
        for k in inside:
            classes.setdefault(kernel_class(k.name, k.kind, triton_names), []).append(k.name)
        streams = sorted({k.stream for k in inside})
        per_call.append({"call": w.index, "event_ms": w.event_ms, "busy_ms": b, "kernels": len(inside),
                         "streams": streams, "triton": len(classes.get("triton", []))})
        if b > HIDDEN_RATIO * w.event_ms + HIDDEN_SLACK_MS:
            findings.append(("hidden_work", f"profiled call {w.index}: GPU busy {b * 1e3:.1f} us on streams {streams} "
                                            f"but CUDA events measured {w.event_ms * 1e3:.1f} us"))
        if classes.get("vendor"):
            findings.append(("forbidden_kernel", f"profiled call {w.index} ran vendor kernels: "
                                                 + ", ".join(sorted(set(classes['vendor'])))[:300]))
        if classes.get("foreign"):
            findings.append(("foreign_kernel", f"profiled call {w.index} ran kernels that are neither the solution's "
                                               "Triton kernels nor PyTorch glue: "
                                               + ", ".join(sorted(set(classes['foreign'])))[:300]))
        if not classes.get("triton"):
            seen = ", ".join(sorted({k.name for k in inside}))[:200]
            findings.append(("no_triton_kernel", f"profiled call {w.index}: none of the solution's Triton kernels ran "
                                                 f"(saw {len(inside)} kernels: {seen})"))
    if windows:
        last = windows[-1].end_ns
        late = [k for k in kernels if k.start_ns > last and kernel_class(k.name, k.kind, triton_names) != "glue"]
        if late:
            findings.append(("hidden_work", f"{len(late)} kernels ran after run() had returned: "
                                            + ", ".join(sorted({k.name for k in late}))[:200]))
    summary = {"calls": per_call, "triton_names": sorted(triton_names)}
    if busy and timed_mean_ms is not None:
        fresh = statistics.median(busy)
        summary["fresh_busy_ms"] = fresh
        if timed_mean_ms < INCONSISTENT_RATIO * fresh:
            findings.append(("timing_inconsistent", f"timed mean {timed_mean_ms * 1e3:.1f} us is below "
                                                    f"{INCONSISTENT_RATIO} x the GPU busy time on fresh inputs "
                                                    f"({fresh * 1e3:.1f} us)"))
    # one finding per rule (the first, with a count)
    firsts: list[tuple[str, str]] = []
    count: dict[str, int] = {}
    for rule, ev in findings:
        count[rule] = count.get(rule, 0) + 1
        if count[rule] == 1:
            firsts.append((rule, ev))
    return [(r, ev + (f" (and {count[r] - 1} more)" if count[r] > 1 else "")) for r, ev in firsts], summary


# ---------------------------------------------------------------------------------------------
# Collection (GPU only)
# ---------------------------------------------------------------------------------------------
def _records(prof) -> tuple[list[KernelRecord], dict[str, tuple[int, int]]]:
    """Kernels and ``d2k_*`` CPU annotation windows from a finished torch.profiler session."""
    kernels, annotations = [], {}
    for e in prof.profiler.kineto_results.events():
        dev = str(e.device_type())
        name = e.name()
        act = e.activity_type() if hasattr(e, "activity_type") else ""
        if dev.endswith("CPU"):
            if name.startswith("d2k_"):
                annotations[name] = (e.start_ns(), e.end_ns())
            continue
        if not dev.endswith("CUDA") or name.startswith("d2k_") or "annotation" in act:
            continue
        kind = "memcpy" if ("memcpy" in act or name.startswith("Memcpy")) else \
            "memset" if ("memset" in act or name.startswith("Memset")) else "kernel"
        stream = e.device_resource_id() if hasattr(e, "device_resource_id") else 0
        kernels.append(KernelRecord(name, e.start_ns(), e.end_ns(), int(stream), kind))
    return kernels, annotations


def profile_calls(calls: list[Callable[[], object]], flush: Callable[[], None] | None,
                  launched: Callable[[], set[str]]) -> tuple[list[KernelRecord], list[Window], set[str]]:
    """Run ``calls`` (each one call of ``run`` on fresh inputs) under torch.profiler.

    ``launched()`` returns the names of the Triton kernels the launch hook saw since the last
    reset; the union over the calls becomes the solution's kernel names.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    sync = torch.cuda.synchronize
    starts = [torch.cuda.Event(enable_timing=True) for _ in calls]
    ends = [torch.cuda.Event(enable_timing=True) for _ in calls]
    names: set[str] = set()
    keep = []
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, fn in enumerate(calls):
            if flush is not None:
                flush()
            sync()
            with record_function(f"d2k_call_{i}"):
                starts[i].record()
                keep.append(fn())
                ends[i].record()
                sync()
            names |= launched()
        with record_function("d2k_after"):
            time.sleep(0.05)
            sync()
    del keep
    kernels, ann = _records(prof)
    windows = [Window(i, *ann[f"d2k_call_{i}"], starts[i].elapsed_time(ends[i]))
               for i in range(len(calls)) if f"d2k_call_{i}" in ann]
    return kernels, windows, names


def profile_replay(replay: Callable[[], None]) -> list[KernelRecord]:
    """Kernels of one CUDA-graph replay (for the graph-vs-eager kernel comparison)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("d2k_replay"):
            replay()
            torch.cuda.synchronize()
    kernels, ann = _records(prof)
    if "d2k_replay" not in ann:
        return kernels
    lo, hi = ann["d2k_replay"]
    return [k for k in kernels if lo <= k.start_ns <= hi]


def compare_graph(replay_kernels: list[KernelRecord], eager_counts: dict[str, float], calls: int,
                  triton_names: set[str]) -> list[tuple[str, str]]:
    """``graph_kernel_mismatch`` when a replay of ``calls`` captured calls (every pass over the
    input sets counts) launches a Triton kernel of the solution fewer than ``calls x`` (its
    minimum count per eager call) times."""
    got: dict[str, int] = {}
    for k in replay_kernels:
        if kernel_class(k.name, k.kind, triton_names) == "triton":
            got[k.name] = got.get(k.name, 0) + 1
    missing = [f"{name}: {got.get(name, 0)} in the graph vs {calls} x {per:g} eager"
               for name, per in sorted(eager_counts.items()) if got.get(name, 0) < calls * per]
    if not got:
        return [("graph_kernel_mismatch", f"the captured graph ({calls} calls) launches none of the solution's "
                                          f"Triton kernels ({len(replay_kernels)} kernels in a replay)")]
    if missing:
        return [("graph_kernel_mismatch", "the captured graph launches fewer Triton kernels than eager calls: "
                 + "; ".join(missing)[:300])]
    return []


def persisting_l2_limit() -> int | None:
    """The device's persisting-L2 set-aside in bytes (``cudaLimitPersistingL2CacheSize``), or
    None where it cannot be read (no GPU, no runtime library found).

    PyTorch exposes no binding for device limits, so this trusted harness code asks the CUDA
    runtime (or the driver, ``cuCtxGetLimit``) that the process already loaded, through ctypes.
    """
    import ctypes

    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
    except Exception:  # noqa: BLE001
        return None
    libs = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line or "libcuda.so" in line}
    except OSError:
        paths = set()
    for p in sorted(paths, key=lambda s: "libcudart" not in s):
        try:
            libs.append((p, ctypes.CDLL(p)))
        except OSError:
            continue
    value = ctypes.c_size_t(0)
    for path, lib in libs:
        try:
            if "libcudart" in path:
                rc = lib.cudaDeviceGetLimit(ctypes.byref(value), 0x06)  # cudaLimitPersistingL2CacheSize
            else:
                rc = lib.cuCtxGetLimit(ctypes.byref(value), 0x06)  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
        except AttributeError:
            continue
        if rc == 0:
            return int(value.value)
    return None
