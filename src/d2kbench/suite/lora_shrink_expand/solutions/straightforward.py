"""Straightforward Triton port: per-token shrink and expand (BGMV), no grouping by adapter.

Contract: identical to ``reference.run`` (``y [T, N]`` updated in place; see the task).

Each token is handled on its own, as a direct reading of the per-token formula suggests:
the shrink launches one program per token, which loads its adapter id, skips the token when
it is -1, and computes h[t] = x[t] A_l^T for all S slices as a GEMV on CUDA cores (FP32
accumulation over K steps) into an FP32 buffer [T, S R]. The expand launches one program per
(token, column block): it gathers each column's rank vector h[t, s(n) R : s(n) R + R] (the
slice of every column from slice_offsets), takes the dot product with B_l's rows, scales and
adds into y's row. Correct, and tokens without an adapter are never touched, but every token
reads its adapter's whole A and B: an adapter used by many tokens of the batch has its
weights fetched once per token (from L2 at best), and no tensor cores are used.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _bgmv_shrink_kernel(x_ptr, a_ptr, h_ptr, map_ptr, K, SR,
                        stride_xt, stride_as, stride_al, stride_ar,
                        R: tl.constexpr, SRP: tl.constexpr, BK: tl.constexpr):
    """h[t, s R + r] = x[t] . lora_a[s, l_t, r] for token program_id(0) (skipped when l_t = -1)."""
    t = tl.program_id(0)
    lora = tl.load(map_ptr + t)
    if lora >= 0:
        q = tl.arange(0, SRP)
        qmask = q < SR
        a_rows = (q // R).to(tl.int64) * stride_as + lora.to(tl.int64) * stride_al + (q % R) * stride_ar
        rk = tl.arange(0, BK)
        acc = tl.zeros((SRP, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kin = (k0 + rk) < K
            xv = tl.load(x_ptr + t.to(tl.int64) * stride_xt + k0 + rk, mask=kin, other=0.0).to(tl.float32)
            av = tl.load(a_ptr + a_rows[:, None] + (k0 + rk)[None, :], mask=qmask[:, None] & kin[None, :], other=0.0)
            acc += av.to(tl.float32) * xv[None, :]
        tl.store(h_ptr + t.to(tl.int64) * SR + q, tl.sum(acc, axis=1), mask=qmask)


@triton.jit
def _bgmv_expand_kernel(h_ptr, b_ptr, y_ptr, map_ptr, offs_ptr, scale, N, S, SR,
                        stride_bl, stride_bn, stride_yt,
                        R: tl.constexpr, BN: tl.constexpr, SP: tl.constexpr):
    """y[t, n] += scale * (h[t, s(n) R : s(n) R + R] . lora_b[l_t, n]) for token program_id(0) and
    BN columns (skipped when l_t = -1)."""
    t = tl.program_id(0)
    lora = tl.load(map_ptr + t)
    if lora >= 0:
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        nmask = cols < N
        sb = tl.arange(0, SP)
        bounds = tl.load(offs_ptr + 1 + sb, mask=sb < S - 1, other=2147483647)
        col_slice = tl.sum((cols[:, None] >= bounds[None, :]).to(tl.int32), axis=1)
        rr = tl.arange(0, R)
        hv = tl.load(h_ptr + t.to(tl.int64) * SR + col_slice[:, None] * R + rr[None, :], mask=nmask[:, None], other=0.0)
        bv = tl.load(b_ptr + lora.to(tl.int64) * stride_bl + cols[:, None].to(tl.int64) * stride_bn + rr[None, :],
                     mask=nmask[:, None], other=0.0)
        d = tl.sum(hv * bv.to(tl.float32), axis=1)
        y_ptrs = y_ptr + t.to(tl.int64) * stride_yt + cols
        yv = tl.load(y_ptrs, mask=nmask, other=0.0)
        tl.store(y_ptrs, (yv.to(tl.float32) + d * scale).to(y_ptr.dtype.element_ty), mask=nmask)


def run(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
        token_lora_mapping: torch.Tensor, scale: float) -> None:
    """Per-token multi-LoRA shrink + expand into ``y`` in place (no host synchronisation).

    Args: as ``reference.run``: x [T, K], y [T, N], lora_a [S, L, R, K], lora_b [L, N, R],
    slice_offsets [S + 1] int32, token_lora_mapping [T] int32, scale float.
    """
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    if T == 0:
        return
    x, lora_a, lora_b = x.contiguous(), lora_a.contiguous(), lora_b.contiguous()
    mapping = token_lora_mapping.contiguous()
    SR = S * R
    SRP = triton.next_power_of_2(SR)
    h = torch.empty((T, SR), dtype=torch.float32, device=x.device)
    bk = 32 if _INTERPRET else max(16, min(128, 8192 // SRP))
    _bgmv_shrink_kernel[(T,)](x, lora_a, h, mapping, K, SR,
                              x.stride(0), lora_a.stride(0), lora_a.stride(1), lora_a.stride(2),
                              R=R, SRP=SRP, BK=bk, num_warps=4)
    bn = 32 if _INTERPRET else 128
    _bgmv_expand_kernel[(T, triton.cdiv(N, bn))](h, lora_b, y, mapping, slice_offsets, scale, N, S, SR,
                                                 lora_b.stride(0), lora_b.stride(1), y.stride(0),
                                                 R=R, BN=bn, SP=max(2, triton.next_power_of_2(S)), num_warps=4)
