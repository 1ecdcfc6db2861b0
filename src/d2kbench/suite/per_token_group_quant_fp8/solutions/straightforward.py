"""Per-token-group FP8 quantisation, straightforward Triton port (no expert design).

The direct translation: one program per (row, group) of ``group_size`` elements (the layout
of the widely used Triton kernels), which loads the group, takes its amax, computes the
scale, divides, clamps, casts, and stores the group's single scale at ``(row, group)`` of
the requested layout (row-major, or column-major with strides ``(1, 4 ceil(M/4))``).
Shapes: ``x [M, K]`` bf16 -> ``(x_q [M, K] float8_e4m3fn, x_s [M, K/gs] float32)``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _quant_one_group(x_ptr, q_ptr, s_ptr, G, stride_xm, stride_qm, s_stride_m, s_stride_g,
                     GS: tl.constexpr, UE8M0: tl.constexpr):
    """Program (row, group): quantise one group of GS elements."""
    pid = tl.program_id(0)
    row = (pid // G).to(tl.int64)
    g = pid % G
    col = g * GS + tl.arange(0, GS)
    x = tl.load(x_ptr + row * stride_xm + col).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10)
    s = tl.div_rn(amax, 448.0)
    if UE8M0:
        s = ((s.to(tl.int32, bitcast=True) + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    y = tl.minimum(tl.maximum(tl.div_rn(x, s), -448.0), 448.0)
    tl.store(q_ptr + row * stride_qm + col, y.to(tl.float8e4nv))
    tl.store(s_ptr + row * s_stride_m + g * s_stride_g, s)


def run(x: torch.Tensor, group_size: int, column_major_scales: bool, scale_ue8m0: bool):
    """Quantise ``x [M, K]`` bf16 per ``group_size`` group to FP8 e4m3 with FP32 scales."""
    M, K = x.shape
    G = K // group_size
    x = x.contiguous()
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    if column_major_scales:
        s = torch.empty((G, (M + 3) // 4 * 4), dtype=torch.float32, device=x.device)[:, :M].T
    else:
        s = torch.empty((M, G), dtype=torch.float32, device=x.device)
    _quant_one_group[(M * G,)](x, q, s, G, x.stride(0), q.stride(0), s.stride(0), s.stride(1),
                               GS=group_size, UE8M0=bool(scale_ue8m0), num_warps=1 if _INTERPRET else 2)
    return q, s
