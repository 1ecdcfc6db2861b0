"""FP8 KV-cache store, straightforward Triton port (no expert design).

A competent direct translation of ``reshape_and_cache_flash``: one program per (token, KV
head), one head row of D elements each, key and value handled by the same program, the
padding slot masked. Shapes: key/value ``[T, Hkv, D]`` bf16, caches ``[NB, BS, Hkv, D]``
float8_e4m3fn written in place, ``slot_mapping [T]`` int64, scales ``[1]`` float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

@triton.jit
def _store_kernel(K, V, KC, VC, SLOTS, KS, VS, D, PAGE,
                  stride_kt, stride_kh, stride_vt, stride_vh,
                  stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
                  BLOCK_D: tl.constexpr):
    """Grid (T, Hkv)."""
    # IEEE division (tl.div_rn): fp32 `/` compiles to the approximate div.full.f32 on the GPU and
    # the cache check is bit-exact.
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(SLOTS + t)
    page = slot // PAGE
    pos = slot % PAGE
    d = tl.arange(0, BLOCK_D)
    mask = (d < D) & (slot >= 0)
    k = tl.load(K + t * stride_kt + h * stride_kh + d, mask=mask, other=0.0).to(tl.float32)
    k = tl.minimum(tl.maximum(tl.div_rn(k, tl.load(KS)), -448.0), 448.0)
    tl.store(KC + page * stride_kcp + pos * stride_kcs + h * stride_kch + d, k.to(tl.float8e4nv), mask=mask)
    v = tl.load(V + t * stride_vt + h * stride_vh + d, mask=mask, other=0.0).to(tl.float32)
    v = tl.minimum(tl.maximum(tl.div_rn(v, tl.load(VS)), -448.0), 448.0)
    tl.store(VC + page * stride_vcp + pos * stride_vcs + h * stride_vch + d, v.to(tl.float8e4nv), mask=mask)


def run(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
        slot_mapping: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """FP8 KV-cache store (in place, returns None)."""
    T, Hkv, D = key.shape
    BS = key_cache.shape[1]
    if T == 0:
        return None
    _store_kernel[(T, Hkv)](key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, D, BS,
                            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
                            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
                            BLOCK_D=triton.next_power_of_2(D), num_warps=4)
    return None
