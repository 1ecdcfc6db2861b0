"""Sliding-window causal GQA attention, straightforward Triton port (no expert design).

The natural first attempt: a textbook causal FlashAttention-2 forward with the window added as
one more term of the mask. Grid (query tiles, B * Hq), one 64 x 64 tile on 4 warps for every
shape (64 x 32 on 8 warps at head dim 256, where the accumulator leaves no room for a 64-key
score tile), one query head per program (GQA by index mapping ``h // G``), natural ``exp`` with
the scale applied to the scores; the key loop runs from key 0 to the diagonal (it stops at the
diagonal but does not skip the tiles left of the window) and evaluates the causal, window and
bounds masks on every tile. The running max starts from a floor of -1e30 and the sink joins the
denominator at the end; soft-capping is ``c * tanh(x / c)`` from ``exp``. Shapes: q
``[B, S, Hq, D]``, k/v ``[B, S, Hkv, D]``, sinks ``[Hq]`` -> o ``[B, S, Hq, D]``, lse
``[B, Hq, S]`` float32.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 16 if _INTERPRET else 64
#: Key tile at head dim 256 (a 64 x 256 fp32 accumulator leaves no registers for 64-key score tiles).
BLOCK_N_D256 = 16 if _INTERPRET else 32


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, SINKS, scale, softcap, S, W, Hq, GROUP,
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr):
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
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    end_n = tl.minimum(start_m + BLOCK_M, S)
    for start_n in range(0, end_n, BLOCK_N):
        kn = start_n + offs_n
        k = tl.load(K + b * stride_kb + kvh * stride_kh + kn[:, None] * stride_ks + offs_d[None, :],
                    mask=kn[:, None] < S, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        if SOFTCAP:
            qk = softcap * (1.0 - 2.0 / (tl.exp(2.0 * qk / softcap) + 1.0))
        visible = (offs_m[:, None] >= kn[None, :]) & (kn[None, :] > offs_m[:, None] - W) & (kn[None, :] < S)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * stride_vb + kvh * stride_vh + kn[:, None] * stride_vs + offs_d[None, :],
                    mask=kn[:, None] < S, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    sink = tl.load(SINKS + h)
    m_all = tl.maximum(m_i, sink)
    total = l_i * tl.exp(m_i - m_all) + tl.exp(sink - m_all)
    out = acc * (tl.exp(m_i - m_all) / total)[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=offs_m[:, None] < S)
    tl.store(LSE + bh.to(tl.int64) * S + offs_m, m_all + tl.log(total), mask=offs_m < S)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window attention: ``o [B, S, Hq, D]`` (q's dtype), ``lse [B, Hq, S]`` float32."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(S, BLOCK), B * Hq)
    _fwd_kernel[grid](q, k, v, o, lse, sinks, scale, float(softcap), S, int(window), Hq, Hq // Hkv,
                      q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                      v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                      HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK if D <= 128 else BLOCK_N_D256, SOFTCAP=softcap > 0,
                      num_warps=4 if D <= 128 else 8, num_stages=2)
    return o, lse
