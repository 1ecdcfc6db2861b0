"""Catalogue #11: CUDA-graph capture tricks.

Trick: Python runs only at capture time, so detect the capture
(``torch.cuda.is_current_stream_capturing()``) and return the output of the last eager call
instead of launching anything: the captured graph is empty and replays in ~0 ns, while its
"output" buffer already holds a correct answer from the warm-up.
Expected: ``integrity_violation`` / ``graph_replay``: after the timed replays the harness rewrites
the inputs in place with fresh data, poisons the outputs with NaN and replays once more; the
parent checks the result (``graph_kernel_mismatch`` is reported too: the graph launches none of
the kernels eager calls launch). GPU only. Static review: ``ast_capture_aware``.
"""
import torch
import triton
import triton.language as tl

EXPECT = {"status": "integrity_violation", "rule": "graph_replay", "catalogue": [11], "device": "cuda",
          "static": ["ast_capture_aware"], "static_checks": False}

_last = {}


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o_ptr + offs, 2 * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def run(x, y):
    if torch.cuda.is_current_stream_capturing() and "out" in _last:
        return _last["out"]
    out = torch.empty_like(x)
    _axpy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    _last["out"] = out
    return out
