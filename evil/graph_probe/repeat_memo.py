"""Catalogue #11: CUDA-graph capture tricks, the repeated-pass variant.

Trick: a graph of short calls holds several passes over the same input sets (at least 64 calls
per replay, so that the replay's fixed cost is spread as in the launch floor's graph). While
capturing, remember the output of each input set (keyed by its tensors' addresses) and, when
the same set comes again in a later pass, return that output without launching anything. The
kernels of the first pass compute correct outputs on every replay, the verification replay on
rewritten inputs passes, and the replay holds 1/passes of the work it claims: the per-call time
drops by the number of passes. Eager calls launch normally (and forget the memo).
Expected: ``integrity_violation`` / ``graph_kernel_mismatch``: the replay is profiled and must
launch the solution's Triton kernels as many times as the eager calls would for every captured
call, every pass counted. Run on the probe's n_16m workload: its 128 MB input sets leave 2 sets in
the graph and many passes (on the 4096-element smoke workload the graph holds 256 sets and one
pass, so there is nothing to skip: measured on the H200, the case came out ``ok`` there).
GPU only. Static review: ``ast_capture_aware``.
"""
import torch
import triton
import triton.language as tl

EXPECT = {"status": "integrity_violation", "rule": "graph_kernel_mismatch", "catalogue": [11], "device": "cuda",
          "static": ["ast_capture_aware"], "static_checks": False, "workloads": ["n_16m"]}

_seen = {}


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, 2 * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def _launch(x, y):
    out = torch.empty_like(x)
    _axpy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return out


def run(x, y):
    if not torch.cuda.is_current_stream_capturing():
        _seen.clear()
        return _launch(x, y)
    key = (x.data_ptr(), y.data_ptr())
    if key not in _seen:
        _seen[key] = _launch(x, y)
    return _seen[key]
