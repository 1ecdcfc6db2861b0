"""Cascade decode, straightforward Triton port (no expert design): a paged decode over each
request's full context that ignores the shared prefix.

A competent translation of the reference: one program per (request, KV head) holds the G query
heads of that KV head (padded to 16 rows for ``tl.dot``), walks the request's pages from token 0
to its length in 64-token tiles through its block-table row, with online softmax (exp2, scale
folded), masked K/V loads (NaN-safe), and writes o. It is correct for any prefix, but every
request reads the shared prefix pages again: N times the prefix traffic (partly caught by the L2
when the prefix is small), and one serial stream per (request, KV head). Shapes: q
``[N, Hq, D]``, caches ``[NB, BS, Hkv, D]``, ``block_tables [N, MAXB]``, ``seq_lens [N]`` int32
-> o ``[N, Hq, D]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64
LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(Q, KC, VC, BT, SL, O, qk_scale,
                   stride_qn, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                   stride_bt, stride_on, stride_oh,
                   GROUP: tl.constexpr, QROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Grid (N, Hkv): the GROUP query heads of KV head ``kvh`` of request ``i`` over its whole context."""
    i = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    seq_len = tl.load(SL + i)
    rows = tl.arange(0, QROWS)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + i * stride_qn + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_head = KC + kvh.to(tl.int64) * stride_kh
    v_head = VC + kvh.to(tl.int64) * stride_vh
    m_i = tl.full([QROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([QROWS], dtype=tl.float32)
    acc = tl.zeros([QROWS, HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        ok = tok < seq_len
        page = tl.load(BT + i * stride_bt + tok // PAGE, mask=ok, other=0).to(tl.int64)
        slot = (tok % PAGE).to(tl.int64)
        k = tl.load(k_head + (page * stride_kp + slot * stride_ks)[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + (page * stride_vp + slot * stride_vs)[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    tl.store(O + i * stride_on + heads[:, None] * stride_oh + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=row_ok[:, None])


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, common_prefix_len: int, scale: float) -> torch.Tensor:
    """Paged decode over the full contexts (``common_prefix_len`` unused): ``o [N, Hq, D]``."""
    N, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    o = torch.empty_like(q)
    _decode_kernel[(N, Hkv)](q, k_cache, v_cache, block_tables, seq_lens, o, scale * LOG2E,
                             q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                             v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                             block_tables.stride(0), o.stride(0), o.stride(1),
                             GROUP=group, QROWS=max(16, triton.next_power_of_2(group)), HEAD_DIM=D, PAGE=BS,
                             BLOCK_N=BLOCK_N, num_warps=4, num_stages=3)
    return o
