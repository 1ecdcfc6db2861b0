"""Paged GQA decode attention, straightforward Triton port (no expert design).

A competent direct translation of paged attention v1: one program per (sequence, query head),
16 tokens per iteration looked up through the block table, dot products on CUDA cores
(``tl.sum`` of elementwise products), online softmax with natural ``exp``, masked loads for
tokens past the sequence end (NaN-safe). No GQA packing (each K/V tile is read once per query
head), no split over long contexts. Shapes: q ``[B, Hq, D]``, caches ``[NB, BS, Hkv, D]``,
``block_tables [B, MAXB]`` int32, ``seq_lens [B]`` int32 -> o ``[B, Hq, D]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 16


@triton.jit
def _decode_kernel(Q, KC, VC, BT, SL, O, scale, GROUP,
                   stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                   stride_bt, stride_ob, stride_oh, PAGE,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (B, Hq): one query head of one sequence per program."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    seq_len = tl.load(SL + b)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d).to(tl.float32)
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), 0)   # fp32 scalars (loop-carried)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), 0)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        ok = tok < seq_len
        page = tl.load(BT + b * stride_bt + tok // PAGE, mask=ok, other=0).to(tl.int64)
        slot = tok % PAGE
        k = tl.load(KC + page[:, None] * stride_kp + slot[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                    mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], 1) * scale
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(VC + page[:, None] * stride_vp + slot[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                    mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, (acc / l_i).to(O.dtype.element_ty))


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Paged GQA decode: ``o [B, Hq, D]`` in q's dtype."""
    B, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    o = torch.empty_like(q)
    _decode_kernel[(B, Hq)](q, k_cache, v_cache, block_tables, seq_lens, o, scale, Hq // Hkv,
                            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                            block_tables.stride(0), o.stride(0), o.stride(1), BS,
                            HEAD_DIM=D, BLOCK_N=BLOCK_N, num_warps=4)
    return o
