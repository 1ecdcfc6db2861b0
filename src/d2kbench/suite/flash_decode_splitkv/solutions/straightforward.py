"""Decode attention over a contiguous KV cache, straightforward Triton port (no expert design).

A competent direct translation of the reference: one program per (sequence, query head) walks
the sequence's keys from first to last in tiles of 64 tokens, dot products on CUDA cores
(``tl.sum`` of elementwise products), online softmax with natural ``exp``, masked loads for
rows past the length (NaN-safe), and writes o and lse. No split of long contexts (a sequence
of 128k tokens is one program's serial stream) and no GQA packing (each K/V tile is read once
per query head). Shapes: q ``[B, Hq, D]``, caches ``[B, LMAX, Hkv, D]``, ``cache_seqlens [B]``
int32 -> (o ``[B, Hq, D]``, lse ``[B, Hq]`` float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64


@triton.jit
def _decode_kernel(Q, K, V, LENS, O, LSE, scale, GROUP,
                   stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                   stride_ob, stride_oh,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (B, Hq): one query head of one sequence per program."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kvh = h // GROUP
    seq_len = tl.load(LENS + b)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), 0)   # fp32 scalars (loop-carried)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), 0)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = (start + offs_n).to(tl.int64)
        ok = tok < seq_len
        k = tl.load(k_base + tok[:, None] * stride_kt + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], 1) * scale
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_base + tok[:, None] * stride_vt + offs_d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, (acc / l_i).to(O.dtype.element_ty))
    tl.store(LSE + b * tl.num_programs(1) + h, m_i + tl.log(l_i))


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention: ``(o [B, Hq, D] in q's dtype, lse [B, Hq] float32, natural log)``."""
    B, Hq, D = q.shape
    _, LMAX, Hkv, _ = k_cache.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq), device=q.device, dtype=torch.float32)
    _decode_kernel[(B, Hq)](q, k_cache, v_cache, cache_seqlens, o, lse, scale, Hq // Hkv,
                            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), o.stride(0), o.stride(1),
                            HEAD_DIM=D, BLOCK_N=BLOCK_N, num_warps=4)
    return o, lse
