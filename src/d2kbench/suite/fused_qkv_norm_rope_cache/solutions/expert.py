"""Expert Triton solution: Qwen3 attention prologue (q/k RMSNorm + NeoX RoPE + paged KV write).

Contract (identical to ``reference.run``)
------------------------------------------
``run(qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, key_cache, value_cache,
slot_mapping, num_q_heads, eps)``: ``qkv [T, (Hq + 2 Hkv) D]`` bf16, gains ``[D]``, the float32
``cos_sin_cache [MAXPOS, D]`` (cos | sin), ``positions``/``slot_mapping [T]`` int64, NHD caches
``[NB, BS, Hkv, D]``. Returns ``q_out [T, Hq, D]``; writes the rotated keys and the values at
the mapped slots (slot -1 = padding: nothing written).

Design
------
L1 -- one pass. All the work is per (token, head) on a D-vector: one reduction (the sum of
    squares), a pairwise rotation between the halves i and i + D/2, and a store. qkv is read
    once, q written once, k and v written once to their cache slots; no intermediate touches
    HBM (an unfused chain moves the heads twice as often). The cos/sin row depends only on the
    token's position: it is loaded once per token and reused by all Hq + Hkv heads.

L2 -- a program owns a tile of tokens x all their heads. Each head is loaded as its two half
    tiles ``[TOK, H, D/2]`` (columns 0..D/2-1 and D/2..D-1), so the rotation is elementwise
    between the two register tiles (no shuffles, no gathers) and the sum of squares is the sum
    of the two halves' sums. The gains (2 x D values) and the token's position, slot,
    cos and sin are loaded once per program and broadcast over the heads. Value heads go from
    registers straight to the cache. Slots and positions are read on the device only; padding
    tokens are masked in the stores (their q is still computed), so the grid depends on T only
    (CUDA-graph capturable).

L3 -- tiles sized from the shapes: about 8-16 K values (32-64 KB of bf16 loads) in flight per
    4- or 8-warp program at prefill sizes (one program per token for the 64-head models,
    two tokens for 32 heads); at decode sizes one token per program, so that the 256-token
    step spreads over 256 programs on the 132 SMs. Cache addresses are formed in int64
    (page * BS * row and slot offsets exceed 2^31 on large pools); head counts that are not
    powers of two (Qwen3-14B's 40) are padded to the next power of two and masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rope(x1, x2, w1, w2, c, s, eps, D: tl.constexpr):
    """RMSNorm over the two halves ``x1, x2 [TOK, H, HALF]`` (float32, padded columns zero),
    gains ``w1, w2 [HALF]``, then the NeoX rotation by ``c, s [TOK, 1, HALF]``."""
    ss = tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)             # [TOK, H]
    rstd = tl.math.rsqrt(ss / D + eps)[:, :, None]
    n1 = x1 * rstd * w1[None, None, :]
    n2 = x2 * rstd * w2[None, None, :]
    return n1 * c - n2 * s, n2 * c + n1 * s


@triton.jit
def _prologue_kernel(
    QKV, QW, KW, CS, POS, KC, VC, SLOTS, QO,
    T, eps,
    stride_t, stride_cs, stride_qt,
    stride_kcp, stride_kcs, stride_vcp, stride_vcs,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    TOK: tl.constexpr, HQ_P: tl.constexpr, HKV_P: tl.constexpr, HALF_P: tl.constexpr,
):
    """Grid (cdiv(T, TOK),): tokens [pid * TOK, +TOK) x all heads."""
    HALF: tl.constexpr = D // 2
    toks = tl.program_id(0) * TOK + tl.arange(0, TOK)
    tmask = toks < T
    t64 = toks.to(tl.int64)
    d = tl.arange(0, HALF_P)
    dmask = d < HALF
    pos = tl.load(POS + toks, mask=tmask, other=0).to(tl.int64)
    slot = tl.load(SLOTS + toks, mask=tmask, other=-1)
    cs_row = CS + pos[:, None] * stride_cs + d[None, :]
    c = tl.load(cs_row, mask=tmask[:, None] & dmask[None, :], other=0.0)[:, None, :]
    s = tl.load(cs_row + HALF, mask=tmask[:, None] & dmask[None, :], other=0.0)[:, None, :]
    row = QKV + t64[:, None, None] * stride_t + d[None, None, :]

    # ---- query heads: normalise, rotate, return
    hq = tl.arange(0, HQ_P)
    qmask = tmask[:, None, None] & (hq < HQ)[None, :, None] & dmask[None, None, :]
    q_ptr = row + (hq * D)[None, :, None]
    q1 = tl.load(q_ptr, mask=qmask, other=0.0).to(tl.float32)
    q2 = tl.load(q_ptr + HALF, mask=qmask, other=0.0).to(tl.float32)
    w1 = tl.load(QW + d, mask=dmask, other=0.0).to(tl.float32)
    w2 = tl.load(QW + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    o1, o2 = _norm_rope(q1, q2, w1, w2, c, s, eps, D)
    out = QO + t64[:, None, None] * stride_qt + (hq * D)[None, :, None] + d[None, None, :]
    tl.store(out, o1.to(QO.dtype.element_ty), mask=qmask)
    tl.store(out + HALF, o2.to(QO.dtype.element_ty), mask=qmask)

    # ---- key heads: normalise, rotate, store at the slot; value heads: copy to the slot
    valid = slot >= 0
    slot64 = tl.where(valid, slot, 0).to(tl.int64)
    page = slot64 // PAGE
    off = slot64 % PAGE
    hk = tl.arange(0, HKV_P)
    kmask = tmask[:, None, None] & (hk < HKV)[None, :, None] & dmask[None, None, :]
    smask = kmask & valid[:, None, None]
    k_ptr = row + ((HQ + hk) * D)[None, :, None]
    k1 = tl.load(k_ptr, mask=kmask, other=0.0).to(tl.float32)
    k2 = tl.load(k_ptr + HALF, mask=kmask, other=0.0).to(tl.float32)
    v_ptr = row + ((HQ + HKV + hk) * D)[None, :, None]
    v1 = tl.load(v_ptr, mask=smask, other=0.0)
    v2 = tl.load(v_ptr + HALF, mask=smask, other=0.0)
    u1 = tl.load(KW + d, mask=dmask, other=0.0).to(tl.float32)
    u2 = tl.load(KW + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    r1, r2 = _norm_rope(k1, k2, u1, u2, c, s, eps, D)
    head_off = (hk * D)[None, :, None] + d[None, None, :]
    kdst = KC + (page * stride_kcp + off * stride_kcs)[:, None, None] + head_off
    tl.store(kdst, r1.to(KC.dtype.element_ty), mask=smask)
    tl.store(kdst + HALF, r2.to(KC.dtype.element_ty), mask=smask)
    vdst = VC + (page * stride_vcp + off * stride_vcs)[:, None, None] + head_off
    tl.store(vdst, v1, mask=smask)
    tl.store(vdst + HALF, v2, mask=smask)


def plan(T: int, Hq: int, Hkv: int, D: int) -> tuple[int, int]:
    """(tokens per program, warps) from the shapes only: about 8-16 K values per program at
    prefill sizes, one token per program when T is small (decode)."""
    per_token = (triton.next_power_of_2(Hq) + 2 * triton.next_power_of_2(Hkv)) * triton.next_power_of_2(D)
    if T <= 1024:
        return 1, 4 if per_token <= 8192 else 8
    tok = max(1, min(8, 16384 // per_token))
    tok = 1 << (tok.bit_length() - 1)                  # a power of two
    return tok, 8 if tok * per_token > 8192 else 4


def run(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
        positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
        num_q_heads: int, eps: float) -> torch.Tensor:
    """Fused prologue (see the module docstring); returns ``q_out [T, Hq, D]``.

    Raises:
        ValueError: a head row that is not contiguous, or an odd head_dim.
    """
    T = qkv.shape[0]
    NB, BS, Hkv, D = key_cache.shape
    Hq = int(num_q_heads)
    if D % 2 or qkv.stride(1) != 1 or key_cache.stride(3) != 1 or key_cache.stride(2) != D \
            or value_cache.stride(3) != 1 or value_cache.stride(2) != D or cos_sin_cache.stride(1) != 1:
        raise ValueError("head rows must be contiguous and head_dim even")
    q_out = torch.empty((T, Hq, D), dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q_out
    tok, warps = plan(T, Hq, Hkv, D)
    _prologue_kernel[(triton.cdiv(T, tok),)](
        qkv, q_norm_weight, k_norm_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, q_out,
        T, float(eps),
        qkv.stride(0), cos_sin_cache.stride(0), q_out.stride(0),
        key_cache.stride(0), key_cache.stride(1), value_cache.stride(0), value_cache.stride(1),
        HQ=Hq, HKV=Hkv, D=D, PAGE=BS, TOK=tok,
        HQ_P=triton.next_power_of_2(Hq), HKV_P=triton.next_power_of_2(Hkv),
        HALF_P=triton.next_power_of_2(D // 2),
        num_warps=warps,
    )
    return q_out
