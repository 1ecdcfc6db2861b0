"""Straightforward Triton port: the all-reduce as a loop of elementwise adds into an FP32
accumulator, then a residual-add + RMSNorm (+ group quantisation) kernel.

The order of the reference, one operation per kernel: the first partial is copied into an FP32
``[T, H]`` buffer, each further rank is added to it in its own launch (rank order, so the sum
is bit-identical to the reference's), and a row kernel rounds the sum, adds the residual,
normalises and quantises. Correct and vectorised, but without the expert design: R + 1
launches, and the FP32 accumulator is written R times and read R times (8 bytes per element
and rank on top of the partials' own 2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
FP8_MAX = tl.constexpr(448.0)
FLOOR = tl.constexpr(1e-10)


@triton.jit
def _accumulate(acc_ptr, p_ptr, n, FIRST: tl.constexpr, BLOCK: tl.constexpr):
    """acc = float32(p) (FIRST) or acc += float32(p), over ``n`` elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    p = tl.load(p_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if not FIRST:
        p = tl.load(acc_ptr + offs, mask=m, other=0.0) + p
    tl.store(acc_ptr + offs, p, mask=m)


@triton.jit
def _add_rmsnorm(acc_ptr, r_ptr, w_ptr, y_ptr, s_ptr, H, eps, QUANT: tl.constexpr, GS: tl.constexpr,
                 NG: tl.constexpr):
    """One program per row: z = bf16(bf16(sum) + residual) stored in place, y = RMSNorm(z) * w."""
    row = tl.program_id(0).to(tl.int64)
    grp = tl.arange(0, NG)
    G = H // GS
    col = grp[:, None] * GS + tl.arange(0, GS)[None, :]
    m = (grp < G)[:, None]
    dt = r_ptr.dtype.element_ty
    acc = tl.load(acc_ptr + row * H + col, mask=m, other=0.0)
    res = tl.load(r_ptr + row * H + col, mask=m, other=0.0)
    z = (acc.to(dt).to(tl.float32) + res.to(tl.float32)).to(dt)
    tl.store(r_ptr + row * H + col, z, mask=m)
    zf = z.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(tl.sum(zf * zf, axis=1), axis=0) / H + eps)
    y = (zf * rstd) * tl.load(w_ptr + col, mask=m, other=0.0).to(tl.float32)
    if QUANT:
        s = tl.div_rn(tl.maximum(tl.max(tl.abs(y), axis=1), FLOOR), FP8_MAX)
        q = tl.minimum(tl.maximum(y / s[:, None], -FP8_MAX), FP8_MAX)
        tl.store(y_ptr + row * H + col, q.to(y_ptr.dtype.element_ty), mask=m)
        tl.store(s_ptr + row * G + grp, s, mask=grp < G)
    else:
        tl.store(y_ptr + row * H + col, y.to(y_ptr.dtype.element_ty), mask=m)


def run(partials: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
        quant: int):
    """All-reduce by repeated adds, then residual add + RMSNorm (+ FP8 group quantisation).

    Args and returns as ``reference.run``: ``partials`` a list of R ``[T, H]`` tensors, ``residual``
    ``[T, H]`` updated in place, returns ``(y [T, H], y_s [T, H / group_size] or [T, 0])``.
    """
    T, H = residual.shape
    G = H // group_size
    n = T * H
    acc = torch.empty((T, H), dtype=torch.float32, device=residual.device)
    for r, p in enumerate(partials):
        _accumulate[(triton.cdiv(n, BLOCK),)](acc, p, n, FIRST=r == 0, BLOCK=BLOCK, num_warps=4)
    ydtype = torch.float8_e4m3fn if quant and residual.dtype == torch.bfloat16 else residual.dtype
    y = torch.empty((T, H), dtype=ydtype, device=residual.device)
    s = torch.empty((T, G if quant else 0), dtype=torch.float32, device=residual.device)
    ng = triton.next_power_of_2(G)
    _add_rmsnorm[(T,)](acc, residual, weight, y, s if quant else y, H, eps, QUANT=bool(quant), GS=group_size,
                       NG=ng, num_warps=8 if ng * group_size >= 4096 else 4)
    return y, s
