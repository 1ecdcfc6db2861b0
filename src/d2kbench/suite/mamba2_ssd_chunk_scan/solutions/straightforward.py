"""Straightforward Triton solution: the selective scan token by token (a fused recurrent kernel).

Contract identical to ``reference.run`` (see task.yaml).

A competent direct port of the recurrence without the SSD decomposition: one program per
(sequence, head, block of 16 rows of the P x DS state) keeps its state slice in registers (read
from the pool slot, or zero) and walks the sequence one token at a time:
``dt' = softplus(dt + dt_bias)``, ``S = e^{dt' A} S + dt' x B^T``, ``y = S C + D x``; at the end the
state goes back to the slot. Minimal bytes and fp32 CUDA-core arithmetic, but T serial steps
per sequence (each a DS-wide reduction), and B and C are re-read by every head and row block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: state rows (of P) per program
BP = 16


@triton.jit
def _softplus(raw):
    """PyTorch's softplus (identity above 20), with log1p(u) = u log(1 + u) / ((1 + u) - 1) so that
    tiny values (dt' ~ 1e-5) keep their relative precision (log(1 + u) alone loses it)."""
    u = tl.exp(tl.minimum(raw, 20.0))
    w = 1.0 + u
    sp = tl.where(w == 1.0, u, u * tl.log(w) / tl.where(w == 1.0, 1.0, w - 1.0))
    return tl.where(raw > 20.0, raw, sp)


@triton.jit
def _selective_scan_kernel(x_ptr, dt_ptr, bias_ptr, a_ptr, b_ptr, c_ptr, d_ptr, cu_ptr, pool_ptr, idx_ptr,
                           init_ptr, y_ptr, s_xt, s_dtt, s_bt, s_ct, s_yt, s_ps, s_ph,
                           H: tl.constexpr, HPG: tl.constexpr, P: tl.constexpr, DS: tl.constexpr,
                           BP: tl.constexpr):
    pt = tl.program_id(0)
    pid = tl.program_id(1)
    seq = pid // H
    h = pid % H
    gi = h // HPG
    bos = tl.load(cu_ptr + seq).to(tl.int64)
    eos = tl.load(cu_ptr + seq + 1).to(tl.int64)
    slot = tl.load(idx_ptr + seq).to(tl.int64)
    has = tl.load(init_ptr + seq) != 0
    a = tl.load(a_ptr + h)
    bias = tl.load(bias_ptr + h)
    dd = tl.load(d_ptr + h)
    rp = pt * BP + tl.arange(0, BP)
    cd = tl.arange(0, DS)
    sp = pool_ptr + slot * s_ps + h * s_ph + rp[:, None] * DS + cd[None, :]
    S = tl.load(sp, mask=has & (rp[:, None] >= 0), other=0.0)
    for t in range(bos, eos):
        raw = tl.load(dt_ptr + t * s_dtt + h).to(tl.float32) + bias
        dtp = _softplus(raw)
        xv = tl.load(x_ptr + t * s_xt + h * P + rp).to(tl.float32)
        bv = tl.load(b_ptr + t * s_bt + gi * DS + cd).to(tl.float32)
        cv = tl.load(c_ptr + t * s_ct + gi * DS + cd).to(tl.float32)
        S = S * tl.exp(dtp * a) + (dtp * xv)[:, None] * bv[None, :]
        yv = tl.sum(S * cv[None, :], 1) + dd * xv
        tl.store(y_ptr + t * s_yt + h * P + rp, yv.to(y_ptr.dtype.element_ty))
    tl.store(sp, S)


def run(x: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
        C: torch.Tensor, D: torch.Tensor, cu_seqlens: torch.Tensor, state_pool: torch.Tensor,
        state_indices: torch.Tensor, has_initial_state: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Token-by-token Mamba2 scan; updates ``state_pool`` in place (``chunk_size`` is not used).

    Raises:
        ValueError: P not a multiple of 16, DS not a power of two, H not a multiple of G, or
            non-contiguous inputs.
    """
    T, H, P = x.shape
    G, DS = B.shape[1], B.shape[2]
    N = state_indices.shape[0]
    if P % BP or DS & (DS - 1) or H % G or not all(t.is_contiguous() for t in (x, dt, B, C, state_pool)):
        raise ValueError("unsupported head or state dims, groups or strides")
    y = torch.empty((T, H, P), dtype=x.dtype, device=x.device)
    init = has_initial_state.view(torch.uint8) if has_initial_state.dtype == torch.bool else has_initial_state
    _selective_scan_kernel[(P // BP, N * H)](x, dt, dt_bias, A, B, C, D, cu_seqlens, state_pool, state_indices,
                                             init, y, x.stride(0), dt.stride(0), B.stride(0), C.stride(0),
                                             y.stride(0), state_pool.stride(0), state_pool.stride(1),
                                             H=H, HPG=H // G, P=P, DS=DS, BP=BP, num_warps=4)
    return y
