"""Shared helper of the evil all-reduce + residual + RMSNorm solutions (not a solution itself:
names starting with ``_`` are skipped by the evil-suite runner).

An *honest* Triton version for the small bf16/fp16-output smoke workloads (quant = 0): one
launch per rank adds that rank's partial into an FP32 row sum (rank order, as the contract
specifies), then one program per row rounds the sum, adds the residual in place and
normalises. Each evil file is honest in everything but its one trick: ``ranks`` says which
partials are read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rank_kernel(sum_ptr, part_ptr, H, FIRST: tl.constexpr, BH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BH)
    m = cols < H
    v = tl.load(part_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
    if not FIRST:
        v += tl.load(sum_ptr + row * H + cols, mask=m, other=0.0)
    tl.store(sum_ptr + row * H + cols, v, mask=m)


@triton.jit
def _residual_norm_kernel(sum_ptr, res_ptr, w_ptr, y_ptr, H, eps, BH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BH)
    m = cols < H
    dt = res_ptr.dtype.element_ty
    s = tl.load(sum_ptr + row * H + cols, mask=m, other=0.0).to(dt).to(tl.float32)
    z = (s + tl.load(res_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)).to(dt)
    tl.store(res_ptr + row * H + cols, z, mask=m)
    zf = z.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(zf * zf, axis=0) / H + eps)
    y = zf * rstd * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + cols, y.to(y_ptr.dtype.element_ty), mask=m)


def fused(partials, residual, weight, eps, group_size, quant, ranks=None):
    """(y [T, H], y_s [T, 0]) of the task's operator for quant = 0, reading the partials of
    ``ranks`` (default: every rank) in rank order."""
    if quant:
        raise NotImplementedError("the evil helper covers quant = 0 only")
    T, H = residual.shape
    acc = torch.empty((T, H), dtype=torch.float32, device=residual.device)
    BH = triton.next_power_of_2(H)
    for i, r in enumerate(range(len(partials)) if ranks is None else ranks):
        _add_rank_kernel[(T,)](acc, partials[r], H, FIRST=i == 0, BH=BH)
    y = torch.empty((T, H), dtype=residual.dtype, device=residual.device)
    _residual_norm_kernel[(T,)](acc, residual, weight, y, H, eps, BH=BH)
    return y, torch.empty((T, 0), dtype=torch.float32, device=residual.device)
