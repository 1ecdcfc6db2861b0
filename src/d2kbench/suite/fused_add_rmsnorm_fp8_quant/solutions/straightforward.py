"""Fused add + RMSNorm + 1 x 128 FP8 quantisation, straightforward Triton port (no expert design).

The composition of the two standard kernels, as the unfused model runs them: a fused
residual-add + RMSNorm kernel (one program per row: z = x + residual written back, rstd, the
normalised row y in FP32 to a scratch buffer), then a per-token-group quantisation kernel
(one program per row: reload y, amax per 128-column group, scale, divide, clamp, cast, store
the codes and the scales in the requested layout). The FP32 scratch keeps the semantics exact.
Shapes: ``x, residual [T, H]``, ``weight [H]`` -> ``(x_q [T, H], x_s [T, H/128] float32)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rmsnorm(x_ptr, r_ptr, w_ptr, y_ptr, H, eps, stride_x, stride_r, stride_y, BLOCK: tl.constexpr):
    """Program ``row``: residual add (written back) and RMSNorm of one row into the FP32 scratch."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    res = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0)
    z = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
    tl.store(r_ptr + row * stride_r + cols, z, mask=ok)
    zf = z.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(zf * zf, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, zf * rstd * w, mask=ok)


@triton.jit
def _group_quant(y_ptr, q_ptr, s_ptr, G, stride_y, stride_q, s_stride_t, s_stride_g, GS: tl.constexpr,
                 NG: tl.constexpr):
    """Program ``row``: quantise the row's groups of GS values of y."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, NG)
    col = g[:, None] * GS + tl.arange(0, GS)[None, :]
    ok = (g < G)[:, None]
    y = tl.load(y_ptr + row * stride_y + col, mask=ok, other=0.0)
    s = tl.div_rn(tl.maximum(tl.max(tl.abs(y), axis=1), 1e-10), 448.0)
    yq = tl.minimum(tl.maximum(tl.div_rn(y, s[:, None]), -448.0), 448.0)
    tl.store(q_ptr + row * stride_q + col, yq.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * s_stride_t + g * s_stride_g, s, mask=g < G)


def run(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
        column_major_scales: bool):
    """Residual add + RMSNorm, then per-token-group FP8 quantisation (two kernels)."""
    T, H = x.shape
    G = H // group_size
    y = torch.empty((T, H), dtype=torch.float32, device=x.device)
    q = torch.empty((T, H), dtype=torch.float8_e4m3fn if x.dtype == torch.bfloat16 else x.dtype, device=x.device)
    if column_major_scales:
        s = torch.empty((G, (T + 3) // 4 * 4), dtype=torch.float32, device=x.device)[:, :T].T
    else:
        s = torch.empty((T, G), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(H)
    _add_rmsnorm[(T,)](x, residual, weight, y, H, eps, x.stride(0), residual.stride(0), y.stride(0), BLOCK=block,
                       num_warps=8 if block >= 4096 else 4)
    _group_quant[(T,)](y, q, s, G, y.stride(0), q.stride(0), s.stride(0), s.stride(1), GS=group_size,
                       NG=triton.next_power_of_2(G), num_warps=8 if block >= 4096 else 4)
    return q, s
