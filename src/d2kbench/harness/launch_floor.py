"""The launch floor: the per-call time of the smallest possible Triton call on this GPU.

A latency-class workload (a call of a few microseconds, e.g. the align step of a MoE layer at
decode) is judged against what launching anything costs, not against a roofline: the bar of
a latency-class workload is "within 3x of the launch floor" (docs/timing.md). The floor is measured, not assumed, with the
harness's own timers (:mod:`d2kbench.harness.timing`) and the workload's timing mode:

* ``graph``: one CUDA graph holds ``calls`` launches of a one-program kernel that stores one
  value; a replay is timed with events and divided by ``calls`` (per-launch cost inside a graph);
* ``events``: one launch between two events, timed like every events-mode call (the host kept
  ahead of the GPU with spin kernels, ``timing.PRIME_US``, so the host's launch latency is not
  in the window).

GPU only (the trusted parent runs it; no solution code is involved).
"""

from __future__ import annotations

import functools

from d2kbench.harness import timing

# Imports inside functions: torch and triton load when the floor is measured.


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _store_one(x_ptr):
        tl.store(x_ptr, 1.0)

    return _store_one


def launch_floor_ms(mode: str, calls: int = 64) -> float:
    """Median per-call time (ms) of a minimal Triton launch under timing ``mode``.

    Args:
        mode: ``graph`` or ``events`` (a task's timing mode).
        calls: launches captured per graph replay (graph mode).

    Raises:
        ValueError: another mode; RuntimeError: no GPU.
    """
    import torch


    if not torch.cuda.is_available():
        raise RuntimeError("the launch floor is measured on a GPU")
    kernel = _kernel()
    buf = torch.zeros(1, device="cuda", dtype=torch.float32)

    def call(_i: int) -> None:
        kernel[(1,)](buf)

    if mode == "graph":
        return timing.time_graph(call, calls, min_samples=20, target_ms=50.0).median_ms
    if mode == "events":
        return timing.time_events(call, 1, flush=lambda: None, min_samples=50, target_ms=50.0).median_ms
    raise ValueError(f"no launch floor for timing mode {mode!r}")
