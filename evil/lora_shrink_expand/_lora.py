"""Shared helper of the evil LoRA shrink + expand solutions (not a solution itself: names
starting with ``_`` are skipped by the evil-suite runner).

An *honest* one-kernel Triton LoRA update for the small smoke shapes: one program per (token,
slice) computes the token's rank-R intermediate for the slice in FP32 and adds the slice's
columns of the expand product into y in place. Each evil file is honest in everything but its
one trick: ``only_adapter`` (>= 0) updates only the tokens of that adapter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _lora_kernel(x_ptr, y_ptr, a_ptr, b_ptr, off_ptr, map_ptr, scale, K, N, R, L, ONLY: tl.constexpr,
                 BK: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    lora = tl.load(map_ptr + t)
    todo = lora >= 0
    if ONLY >= 0:
        todo = lora == ONLY
    if todo:
        ks = tl.arange(0, BK)
        rs = tl.arange(0, BR)
        x = tl.load(x_ptr + t * K + ks, mask=ks < K, other=0.0).to(tl.float32)
        a_rows = (s * L + lora).to(tl.int64) * R + rs
        a = tl.load(a_ptr + a_rows[:, None] * K + ks[None, :], mask=(rs[:, None] < R) & (ks[None, :] < K), other=0.0)
        h = tl.sum(a.to(tl.float32) * x[None, :], axis=1)                       # [BR] shrink, FP32
        ns = tl.load(off_ptr + s) + tl.arange(0, BN)
        nm = ns < tl.load(off_ptr + s + 1)
        b = tl.load(b_ptr + (lora.to(tl.int64) * N + ns[:, None]) * R + rs[None, :],
                    mask=nm[:, None] & (rs[None, :] < R), other=0.0)
        d = tl.sum(b.to(tl.float32) * h[None, :], axis=1)                       # [BN] expand, FP32
        y = tl.load(y_ptr + t * N + ns, mask=nm, other=0.0)
        tl.store(y_ptr + t * N + ns, (y.to(tl.float32) + scale * d).to(y.dtype), mask=nm)


def lora_update(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale, only_adapter: int = -1) -> None:
    """y += scale * (x @ A^T) @ B^T per token and slice, in place (the task's operator)."""
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    _lora_kernel[(T, S)](x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale, K, N, R, L,
                         ONLY=only_adapter, BK=triton.next_power_of_2(K), BR=triton.next_power_of_2(R),
                         BN=triton.next_power_of_2(N))
