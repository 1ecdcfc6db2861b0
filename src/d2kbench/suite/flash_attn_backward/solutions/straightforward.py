"""Causal GQA attention backward, straightforward Triton port (no expert design).

A competent textbook FlashAttention-2 backward in four kernels: a delta pre-pass
(delta = rowsum(dO * O)); a dQ kernel over (query tile, b, query head); a dK/dV kernel over
(key tile, b, query head) that writes per-query-head float32 partial dK and dV; a kernel that sums
the partials over the G query heads of each KV head. Both main kernels recompute P from the LSE
with natural ``exp`` and the scale applied to the scores, stop at the diagonal (causal skip) but
evaluate the causal and bounds masks on every tile, use one 64 x 64 tile for every shape and
launch tiles in index order. Shapes: q, o, do ``[B, S, Hq, D]``, k, v ``[B, S, Hkv, D]``, lse
``[B, Hq, S]`` float32 -> dq ``[B, S, Hq, D]``, dk, dv ``[B, S, Hkv, D]`` (q's dtype).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 32 if _INTERPRET else 64


@triton.jit
def _delta_kernel(O, DO, Delta, S, Hq, stride_b, stride_s, stride_h, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[b, h, i] = sum_d o * do; grid (cdiv(S, BLOCK_M), B * Hq)."""
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    off = b * stride_b + h * stride_h + offs_m[:, None] * stride_s + offs_d[None, :]
    o = tl.load(O + off, mask=offs_m[:, None] < S, other=0.0).to(tl.float32)
    do = tl.load(DO + off, mask=offs_m[:, None] < S, other=0.0).to(tl.float32)
    tl.store(Delta + bh * S + offs_m, tl.sum(o * do, 1), mask=offs_m < S)


@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, Delta, DQ, scale, S, Hq, GROUP,
               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(S, BLOCK_M), B * Hq): dQ of one query tile of one head."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_off = b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
    q = tl.load(Q + q_off, mask=offs_m[:, None] < S, other=0.0)
    do = tl.load(DO + q_off, mask=offs_m[:, None] < S, other=0.0)
    lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
    delta = tl.load(Delta + bh * S + offs_m, mask=offs_m < S, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    end_n = tl.minimum(start_m + BLOCK_M, S)
    for start_n in range(0, end_n, BLOCK_N):
        kn = start_n + offs_n
        kv_off = b * stride_kb + kvh * stride_kh + kn[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv_off, mask=kn[:, None] < S, other=0.0)
        v = tl.load(V + kv_off, mask=kn[:, None] < S, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        visible = (offs_m[:, None] >= kn[None, :]) & (offs_m[:, None] < S) & (kn[None, :] < S)
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + q_off, (dq * scale).to(DQ.dtype.element_ty), mask=offs_m[:, None] < S)


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, Delta, DKp, DVp, scale, S, Hq, GROUP,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(S, BLOCK_N), B * Hq): the dK/dV contribution of one query head to one key tile,
    written to float32 partials laid out like q ([B, S, Hq, D])."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kvh = h // GROUP
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_off = b * stride_kb + kvh * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :]
    k = tl.load(K + kv_off, mask=offs_n[:, None] < S, other=0.0)
    v = tl.load(V + kv_off, mask=offs_n[:, None] < S, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in range(start_n, S, BLOCK_M):
        qm = start_m + offs_m
        q_off = b * stride_qb + h * stride_qh + qm[:, None] * stride_qs + offs_d[None, :]
        q = tl.load(Q + q_off, mask=qm[:, None] < S, other=0.0)
        do = tl.load(DO + q_off, mask=qm[:, None] < S, other=0.0)
        lse = tl.load(LSE + bh * S + qm, mask=qm < S, other=0.0)
        delta = tl.load(Delta + bh * S + qm, mask=qm < S, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale                                   # [BLOCK_M, BLOCK_N]
        visible = (qm[:, None] >= offs_n[None, :]) & (qm[:, None] < S) & (offs_n[None, :] < S)
        p = tl.where(visible, tl.exp(s - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    p_off = b * stride_qb + h * stride_qh + offs_n[:, None] * stride_qs + offs_d[None, :]
    tl.store(DKp + p_off, dk * scale, mask=offs_n[:, None] < S)
    tl.store(DVp + p_off, dv, mask=offs_n[:, None] < S)


@triton.jit
def _group_sum_kernel(Xp, Y, S, Hkv, GROUP, stride_pb, stride_ps, stride_ph, stride_yb, stride_ys, stride_yh,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """y[b, i, g, :] = sum over the GROUP query heads of KV head g of the partials; grid
    (cdiv(S, BLOCK_M), B * Hkv)."""
    bg = tl.program_id(1)
    b = bg // Hkv
    g = bg % Hkv
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for j in range(GROUP):
        acc += tl.load(Xp + b * stride_pb + (g * GROUP + j) * stride_ph + offs_m[:, None] * stride_ps + offs_d[None, :],
                       mask=offs_m[:, None] < S, other=0.0)
    tl.store(Y + b * stride_yb + g * stride_yh + offs_m[:, None] * stride_ys + offs_d[None, :],
             acc.to(Y.dtype.element_ty), mask=offs_m[:, None] < S)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal GQA attention backward: ``(dq [B, S, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, D])``
    in q's dtype (inputs contiguous BSHD, lse ``[B, Hq, S]`` float32)."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    delta = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    dq = torch.empty_like(q)
    dk_part = torch.empty((B, S, Hq, D), device=q.device, dtype=torch.float32)
    dv_part = torch.empty((B, S, Hq, D), device=q.device, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    _delta_kernel[(triton.cdiv(S, BLOCK), B * Hq)](o, do, delta, S, Hq, q.stride(0), q.stride(1), q.stride(2),
                                                   HEAD_DIM=D, BLOCK_M=BLOCK)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2))
    _dq_kernel[(triton.cdiv(S, BLOCK), B * Hq)](q, k, v, do, lse, delta, dq, scale, S, Hq, G, *strides,
                                                HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, num_warps=4, num_stages=2)
    _dkdv_kernel[(triton.cdiv(S, BLOCK), B * Hq)](q, k, v, do, lse, delta, dk_part, dv_part, scale, S, Hq, G, *strides,
                                                  HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, num_warps=4, num_stages=2)
    for part, out in ((dk_part, dk), (dv_part, dv)):
        _group_sum_kernel[(triton.cdiv(S, BLOCK), B * Hkv)](part, out, S, Hkv, G, part.stride(0), part.stride(1),
                                                            part.stride(2), out.stride(0), out.stride(1), out.stride(2),
                                                            HEAD_DIM=D, BLOCK_M=BLOCK)
    return dq, dk, dv
