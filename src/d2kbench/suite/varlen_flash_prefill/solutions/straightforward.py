"""Packed varlen causal GQA attention forward, straightforward Triton port (no expert design).

The layout of SGLang's ``context_attention_fwd``: grid ``(N, Hq, cdiv(max_seqlen, 64))``, one
64 x 64 tile size for every shape, each program one query tile of one head of one sequence,
exiting at once when the tile starts past its sequence's end (the grid is the padded batch:
``N * max_seqlen`` rows). FlashAttention-2 online softmax with natural ``exp`` and the scale
applied to the scores; the key loop stops at the diagonal, but the causal and bounds masks are
evaluated on every tile; query tiles launch in index order (short causal rows first); GQA by
index mapping only (``h // G``). Shapes: q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``, cu_seqlens
``[N + 1]`` -> o ``[T, Hq, D]``, lse ``[Hq, T]`` float32.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 16 if _INTERPRET else 64


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, CU, scale, T, GROUP,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (N, Hq, cdiv(max_seqlen, BLOCK_M)): one query tile of one head of one sequence."""
    seq = tl.program_id(0)
    h = tl.program_id(1)
    start_m = tl.program_id(2) * BLOCK_M
    bos = tl.load(CU + seq)
    L = tl.load(CU + seq + 1) - bos
    if start_m >= L:
        return
    kvh = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row = (bos + offs_m).to(tl.int64)
    q = tl.load(Q + row[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=offs_m[:, None] < L, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    end_n = tl.minimum(start_m + BLOCK_M, L)
    for start_n in range(0, end_n, BLOCK_N):
        kn = start_n + offs_n
        krow = (bos + kn).to(tl.int64)
        k = tl.load(K + krow[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :], mask=kn[:, None] < L, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        qk = tl.where((offs_m[:, None] >= kn[None, :]) & (kn[None, :] < L), qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + krow[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :], mask=kn[:, None] < L, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + row[:, None] * stride_ot + h * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=offs_m[:, None] < L)
    tl.store(LSE + h.to(tl.int64) * T + row, m_i + tl.log(l_i), mask=offs_m < L)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen causal GQA attention: ``o [T, Hq, D]`` (q's dtype), ``lse [Hq, T]`` float32."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    N = cu_seqlens.shape[0] - 1
    o = torch.empty_like(q)
    lse = torch.empty((Hq, T), device=q.device, dtype=torch.float32)
    grid = (N, Hq, triton.cdiv(max_seqlen, BLOCK))
    _fwd_kernel[grid](q, k, v, o, lse, cu_seqlens, scale, T, Hq // Hkv,
                      q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                      o.stride(0), o.stride(1), HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, num_warps=4, num_stages=2)
    return o, lse
