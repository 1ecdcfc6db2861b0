"""Chunked prefill over a paged prefix, straightforward Triton port (no expert design).

Two launches, as a first port of the PyTorch reference does it: a copy kernel writes the new
tokens' keys and values into their cache slots (one program per token and KV head), then one
paged attention kernel runs over every key of each request (context and chunk alike) through
the block table, reading the chunk's keys back from the cache it has just written. The grid is
the padded batch ``(N, Hq, cdiv(max_seqlen_q, 64))``: one 64-token query tile of one query head
of one request per program (programs past a chunk's end exit at once; a decode request
occupies a 64-row tile for its single token), 64-key tiles, the causal-with-offset and length
masks evaluated on every key tile, natural ``exp`` with the scale applied to the scores, GQA by
index mapping (``h // G``). Shapes: q ``[T, Hq, D]``, k_new/v_new ``[T, Hkv, D]``, pages
``[NB, BS, Hkv, D]`` -> o ``[T, Hq, D]``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 16 if _INTERPRET else 64


@triton.jit
def _store_kernel(KN, VN, KC, VC, SLOT, stride_kt, stride_kh, stride_vt, stride_vh,
                  stride_cp, stride_cs, stride_ch, BS, HEAD_DIM: tl.constexpr):
    """Grid (T, Hkv): copy token t's key and value of one KV head into slot ``slot_mapping[t]``."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    slot = tl.load(SLOT + t)
    dst = (slot // BS) * stride_cp + (slot % BS) * stride_cs + h * stride_ch
    tl.store(KC + dst + d, tl.load(KN + t * stride_kt + h * stride_kh + d))
    tl.store(VC + dst + d, tl.load(VN + t * stride_vt + h * stride_vh + d))


@triton.jit
def _paged_fwd_kernel(Q, KC, VC, O, CU, CTX, BT, scale, GROUP,
                      stride_qt, stride_qh, stride_ot, stride_oh, stride_cp, stride_cs, stride_ch, stride_bt, BS,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (N, Hq, cdiv(max_seqlen_q, BLOCK_M)): one query tile of one head of one request."""
    req = tl.program_id(0)
    h = tl.program_id(1)
    start_m = tl.program_id(2) * BLOCK_M
    q0 = tl.load(CU + req)
    ql = tl.load(CU + req + 1) - q0
    if start_m >= ql:
        return
    ctx = tl.load(CTX + req)
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row = (q0 + offs_m).to(tl.int64)
    q = tl.load(Q + row[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=offs_m[:, None] < ql, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    total = ctx + ql
    end_n = ctx + tl.minimum(start_m + BLOCK_M, ql)
    for start_n in range(0, end_n, BLOCK_N):
        kn = start_n + offs_n
        kok = kn < total
        page = tl.load(BT + req.to(tl.int64) * stride_bt + kn // BS, mask=kok, other=0).to(tl.int64)
        off = page * stride_cp + (kn % BS) * stride_cs + kvh * stride_ch
        k = tl.load(KC + off[:, None] + offs_d[None, :], mask=kok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        qk = tl.where((ctx + offs_m[:, None] >= kn[None, :]) & kok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VC + off[:, None] + offs_d[None, :], mask=kok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + row[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=offs_m[:, None] < ql)


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Write the cache, then paged causal-with-offset attention: ``o [T, Hq, D]`` (q's dtype)."""
    T, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    N = cu_seqlens_q.shape[0] - 1
    o = torch.empty_like(q)
    _store_kernel[(T, Hkv)](k_new, v_new, k_cache, v_cache, slot_mapping, k_new.stride(0), k_new.stride(1),
                            v_new.stride(0), v_new.stride(1), k_cache.stride(0), k_cache.stride(1),
                            k_cache.stride(2), BS, HEAD_DIM=D, num_warps=1)
    grid = (N, Hq, triton.cdiv(max_seqlen_q, BLOCK))
    _paged_fwd_kernel[grid](q, k_cache, v_cache, o, cu_seqlens_q, context_lens, block_tables, scale, Hq // Hkv,
                            q.stride(0), q.stride(1), o.stride(0), o.stride(1), k_cache.stride(0),
                            k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), BS,
                            HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, num_warps=4, num_stages=2)
    return o
