"""Causal GQA attention forward, straightforward Triton port (no expert design).

A competent textbook FlashAttention-2 forward: grid (query tiles, B * Hq), one 64 x 64 tile
size for every shape, online softmax with natural ``exp`` and the scale applied to the scores,
KV loop stopped at the diagonal (causal skip) but the causal and bounds masks evaluated on every
tile, query tiles scheduled in index order (short tiles first), GQA by index mapping only
(``h // G``). Shapes: q ``[B, S, Hq, D]``, k/v ``[B, S, Hkv, D]`` -> o ``[B, S, Hq, D]``,
lse ``[B, Hq, S]`` float32.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 32 if _INTERPRET else 64


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, scale, S, Hq, GROUP,
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(S, BLOCK_M), B * Hq): one query tile of one head per program."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    end_n = tl.minimum(start_m + BLOCK_M, S)
    for start_n in range(0, end_n, BLOCK_N):
        kn = start_n + offs_n
        k = tl.load(K + b * stride_kb + kvh * stride_kh + kn[:, None] * stride_ks + offs_d[None, :],
                    mask=kn[:, None] < S, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        qk = tl.where((offs_m[:, None] >= kn[None, :]) & (kn[None, :] < S), qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * stride_vb + kvh * stride_vh + kn[:, None] * stride_vs + offs_d[None, :],
                    mask=kn[:, None] < S, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=offs_m[:, None] < S)
    tl.store(LSE + bh.to(tl.int64) * S + offs_m, m_i + tl.log(l_i), mask=offs_m < S)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention forward: ``o [B, S, Hq, D]`` (q's dtype), ``lse [B, Hq, S]`` float32."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(S, BLOCK), B * Hq)
    _fwd_kernel[grid](q, k, v, o, lse, scale, S, Hq, Hq // Hkv,
                      q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                      v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                      HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, num_warps=4, num_stages=2)
    return o, lse
