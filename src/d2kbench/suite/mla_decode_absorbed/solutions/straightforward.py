"""MLA decode, straightforward Triton port (no expert design): decompress, then attend.

A competent direct translation of the model's definition (the reference): for a group of
requests at a time (a workspace of bounded size),

1. ``_decompress_kernel``: per (page of a request, head), the page's 64 latent rows times the
   head's up-projections on tensor cores, ``k_nope = c @ w_uk[h]^T`` and ``v = c @ w_uv[h]``,
   written as bf16 per-head keys and values ``[group, capacity, H, 128]`` (pages past the
   request's length are skipped, the last page is masked, so NaN rows are never read);
2. ``_attend_kernel``: per (request, head), an online-softmax decode over those keys (plus the
   rotary part read from the cache) and values, dot products on CUDA cores.

Correct, but it does the per-token per-head decompression the absorption avoids: about 120x the
FLOPs of the absorbed form, and per-head keys and values written and read back (30x to 230x the
latent bytes). Shapes: ``q_nope [B, H, DN]``, ``q_pe [B, H, DR]``, ``kv_cache [NP, PS, DL + DR]``,
``block_table [B, MAXP]``, ``seq_lens [B]``, ``w_uk [H, DN, DL]``, ``w_uv [H, DL, DV]`` ->
``o [B, H, DV]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Elements of the per-head key/value workspace of one group of requests (2 GB in bf16).
WORKSPACE_ELEMENTS = 1 << 30
BLOCK_K = 64
BLOCK_N = 64


@triton.jit
def _decompress_kernel(KV, BT, SL, WUK, WUV, KN, VV, b0, stride_kp, stride_ks, stride_bt,
                       stride_kn_b, stride_kn_t, stride_kn_h, stride_vv_b, stride_vv_t, stride_vv_h,
                       DN: tl.constexpr, DL: tl.constexpr, DV: tl.constexpr, PAGE: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """Grid (MAXP, H, group): keys and values of head h for page j of request b0 + g."""
    j = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    g = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(SL + b0 + g)
    if j * PAGE < seq_len:
        page = tl.load(BT + (b0 + g) * stride_bt + j).to(tl.int64)
        rows = tl.arange(0, PAGE)
        ok = j * PAGE + rows < seq_len
        offs_n = tl.arange(0, DN)
        offs_v = tl.arange(0, DV)
        k_acc = tl.zeros([PAGE, DN], dtype=tl.float32)
        v_acc = tl.zeros([PAGE, DV], dtype=tl.float32)
        for k0 in range(0, DL, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            c = tl.load(KV + page * stride_kp + rows[:, None] * stride_ks + offs_k[None, :], mask=ok[:, None], other=0.0)
            wk = tl.load(WUK + h * DN * DL + offs_n[None, :] * DL + offs_k[:, None])        # [BLOCK_K, DN] = w_uk[h]^T
            wv = tl.load(WUV + h * DL * DV + offs_k[:, None] * DV + offs_v[None, :])        # [BLOCK_K, DV]
            k_acc = tl.dot(c, wk, k_acc)
            v_acc = tl.dot(c, wv, v_acc)
        t = (j * PAGE + rows).to(tl.int64)
        tl.store(KN + g * stride_kn_b + t[:, None] * stride_kn_t + h * stride_kn_h + offs_n[None, :],
                 k_acc.to(KN.dtype.element_ty), mask=ok[:, None])
        tl.store(VV + g * stride_vv_b + t[:, None] * stride_vv_t + h * stride_vv_h + offs_v[None, :],
                 v_acc.to(VV.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _attend_kernel(QN, QP, KV, BT, SL, KN, VV, O, b0, scale,
                   stride_qn_b, stride_qn_h, stride_qp_b, stride_qp_h, stride_kp, stride_ks, stride_bt,
                   stride_kn_b, stride_kn_t, stride_kn_h, stride_vv_b, stride_vv_t, stride_vv_h, stride_ob, stride_oh,
                   DN: tl.constexpr, DR: tl.constexpr, DL: tl.constexpr, DV: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Grid (group, H): online-softmax decode of head h of request b0 + g over its decompressed
    keys and values."""
    g = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    b = b0 + g
    seq_len = tl.load(SL + b)
    offs_n = tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, DN)
    offs_r = tl.arange(0, DR)
    offs_v = tl.arange(0, DV)
    qn = tl.load(QN + b * stride_qn_b + h * stride_qn_h + offs_e).to(tl.float32)
    qp = tl.load(QP + b * stride_qp_b + h * stride_qp_h + offs_r).to(tl.float32)
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), 0)
    acc = tl.zeros([DV], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        t = start + offs_n
        ok = t < seq_len
        t64 = t.to(tl.int64)
        page = tl.load(BT + b * stride_bt + t // PAGE, mask=ok, other=0).to(tl.int64)
        kn = tl.load(KN + g * stride_kn_b + t64[:, None] * stride_kn_t + h * stride_kn_h + offs_e[None, :],
                     mask=ok[:, None], other=0.0).to(tl.float32)
        kpe = tl.load(KV + page[:, None] * stride_kp + (t64 % PAGE)[:, None] * stride_ks + DL + offs_r[None, :],
                      mask=ok[:, None], other=0.0).to(tl.float32)
        s = (tl.sum(kn * qn[None, :], 1) + tl.sum(kpe * qp[None, :], 1)) * scale
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(VV + g * stride_vv_b + t64[:, None] * stride_vv_t + h * stride_vv_h + offs_v[None, :],
                    mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + offs_v, (acc / l_i).to(O.dtype.element_ty))


def run(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """Decompress-then-attend MLA decode: ``o [B, H, DV]`` in q_nope's dtype."""
    B, H, DN = q_nope.shape
    DR = q_pe.shape[2]
    _, PS, _ = kv_cache.shape
    DL, DV = w_uv.shape[1], w_uv.shape[2]
    MAXP = block_table.shape[1]
    cap = MAXP * PS
    group = max(1, min(B, WORKSPACE_ELEMENTS // (cap * H * (DN + DV))))
    kn = torch.empty((group, cap, H, DN), device=q_nope.device, dtype=q_nope.dtype)
    vv = torch.empty((group, cap, H, DV), device=q_nope.device, dtype=q_nope.dtype)
    o = torch.empty((B, H, DV), device=q_nope.device, dtype=q_nope.dtype)
    for b0 in range(0, B, group):                    # static loop over groups of requests
        n = min(group, B - b0)
        _decompress_kernel[(MAXP, H, n)](kv_cache, block_table, seq_lens, w_uk, w_uv, kn, vv, b0,
                                         kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
                                         kn.stride(0), kn.stride(1), kn.stride(2), vv.stride(0), vv.stride(1), vv.stride(2),
                                         DN=DN, DL=DL, DV=DV, PAGE=PS, BLOCK_K=min(BLOCK_K, DL), num_warps=4)
        _attend_kernel[(n, H)](q_nope, q_pe, kv_cache, block_table, seq_lens, kn, vv, o, b0, scale,
                               q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
                               kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
                               kn.stride(0), kn.stride(1), kn.stride(2), vv.stride(0), vv.stride(1), vv.stride(2),
                               o.stride(0), o.stride(1), DN=DN, DR=DR, DL=DL, DV=DV, PAGE=PS, BLOCK_N=BLOCK_N,
                               num_warps=4)
    return o
