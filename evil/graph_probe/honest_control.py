"""Control case (no cheat): an honest Triton kernel on the graph-timed probe task.

It must come out ``ok``: on the GPU this exercises every CUDA-graph defence (verification
replay on rewritten inputs, per-replay input perturbation, graph-vs-eager kernel comparison,
profiler cross-checks) against a solution that does nothing wrong.
"""
import torch
import triton
import triton.language as tl

EXPECT = {"status": "ok", "catalogue": [], "device": "cpu", "static": []}


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, 2 * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def run(x, y):
    out = torch.empty_like(x)
    _axpy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out
