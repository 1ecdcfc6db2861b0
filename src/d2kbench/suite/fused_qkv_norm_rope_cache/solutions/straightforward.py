"""Straightforward Triton port: the unfused chain of the model, one kernel per step.

A competent direct translation of what the eager model does, step by step, each step its own
kernel with its result in HBM: (1) RMSNorm of every q and k head (one program per token and
head) into a normalised buffer of the input dtype; (2) NeoX rotation of the normalised heads
(one program per token and head), writing q_out and a rotated-key buffer; (3) the cache write
(one program per token and KV head: the rotated key and the value head copied to the slot).
Shapes as in ``reference.run``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(QKV, W_Q, W_K, OUT, stride_t, stride_ot, eps, HQ, D, BLOCK_D: tl.constexpr):
    """Grid (T, Hq + Hkv): OUT[t, h] = x * rsqrt(mean(x^2) + eps) * w."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    m = d < D
    x = tl.load(QKV + t * stride_t + h * D + d, mask=m, other=0.0).to(tl.float32)
    is_q = h < HQ
    w = tl.where(is_q, tl.load(W_Q + d, mask=m, other=0.0), tl.load(W_K + d, mask=m, other=0.0)).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    tl.store(OUT + t * stride_ot + h * D + d, (x * rstd * w).to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(NORMED, CS, POS, QO, KR, stride_nt, stride_cs, stride_qt, stride_kt, HQ, D,
                 BLOCK_H: tl.constexpr):
    """Grid (T, Hq + Hkv): rotate one normalised head by its token's position."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    half = D // 2
    d = tl.arange(0, BLOCK_H)
    m = d < half
    pos = tl.load(POS + t)
    c = tl.load(CS + pos * stride_cs + d, mask=m, other=0.0)
    s = tl.load(CS + pos * stride_cs + half + d, mask=m, other=0.0)
    x1 = tl.load(NORMED + t * stride_nt + h * D + d, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(NORMED + t * stride_nt + h * D + half + d, mask=m, other=0.0).to(tl.float32)
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    if h < HQ:
        dst = QO + t * stride_qt + h * D
    else:
        dst = KR + t * stride_kt + (h - HQ) * D
    tl.store(dst + d, o1.to(QO.dtype.element_ty), mask=m)
    tl.store(dst + half + d, o2.to(QO.dtype.element_ty), mask=m)


@triton.jit
def _cache_kernel(KR, QKV, KC, VC, SLOTS, stride_kt, stride_t, stride_kcp, stride_kcs, stride_vcp, stride_vcs,
                  HQ, HKV, D, PAGE, BLOCK_D: tl.constexpr):
    """Grid (T, Hkv): copy the rotated key and the value head of one token to its slot."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(SLOTS + t)
    d = tl.arange(0, BLOCK_D)
    m = (d < D) & (slot >= 0)
    page = slot // PAGE
    off = slot % PAGE
    k = tl.load(KR + t * stride_kt + h * D + d, mask=m, other=0.0)
    v = tl.load(QKV + t * stride_t + (HQ + HKV + h) * D + d, mask=m, other=0.0)
    tl.store(KC + page * stride_kcp + off * stride_kcs + h * D + d, k, mask=m)
    tl.store(VC + page * stride_vcp + off * stride_vcs + h * D + d, v, mask=m)


def run(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
        positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
        num_q_heads: int, eps: float) -> torch.Tensor:
    """Three kernels (norm, rotation, cache write); returns ``q_out [T, Hq, D]``."""
    T = qkv.shape[0]
    NB, BS, Hkv, D = key_cache.shape
    Hq = int(num_q_heads)
    q_out = torch.empty((T, Hq, D), dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q_out
    normed = torch.empty((T, Hq + Hkv, D), dtype=qkv.dtype, device=qkv.device)
    k_rot = torch.empty((T, Hkv, D), dtype=qkv.dtype, device=qkv.device)
    block_d = triton.next_power_of_2(D)
    _rmsnorm_kernel[(T, Hq + Hkv)](qkv, q_norm_weight, k_norm_weight, normed, qkv.stride(0), normed.stride(0),
                                   float(eps), Hq, D, BLOCK_D=block_d, num_warps=1)
    _rope_kernel[(T, Hq + Hkv)](normed, cos_sin_cache, positions, q_out, k_rot, normed.stride(0),
                                cos_sin_cache.stride(0), q_out.stride(0), k_rot.stride(0), Hq, D,
                                BLOCK_H=triton.next_power_of_2(D // 2), num_warps=1)
    _cache_kernel[(T, Hkv)](k_rot, qkv, key_cache, value_cache, slot_mapping, k_rot.stride(0), qkv.stride(0),
                            key_cache.stride(0), key_cache.stride(1), value_cache.stride(0), value_cache.stride(1),
                            Hq, Hkv, D, BS, BLOCK_D=block_d, num_warps=1)
    return q_out
