"""Top-k / top-p / temperature sampling, straightforward Triton port (no expert design).

A competent direct translation without a sort (``torch.sort`` is forbidden and a Triton sort of
a 150k-entry row does not fit a program): one program per request streams its row of logits
tile by tile for every question it asks.

1. one pass: the maximum, the softmax denominator and the number of finite logits;
2. the k-th largest logit by a binary search over the 32-bit order-preserving integer key of
   the float (about 32 passes, each counting the logits at or above the probe), exact under ties;
3. the top-k mass, then the top-p cut by a second 32-step binary search on the key, each pass
   summing the masses at or above the probe;
4. one pass that inverts the CDF in vocabulary order (a tile prefix sum plus a running carry).

Every pass re-reads the whole row (from L2 or HBM): about 67 passes for a row with both filters.

Shapes: ``logits [B, V]`` fp32, ``temperature [B]`` fp32, ``top_k [B]`` int32, ``top_p [B]``
fp32, ``uniforms [B]`` fp32 -> ``ids [B]`` int64. One launch, no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _key(x):
    """Order-preserving int32 key of a float32 (-0.0 folded into +0.0)."""
    b = (x + 0.0).to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _count_ge(row_ptr, V, probe, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    n = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + offs, mask=start + offs < V, other=float("-inf"))
        n += ((_key(x) >= probe) & (start + offs < V)).to(tl.int32)
    return tl.sum(n, axis=0)


@triton.jit
def _mass_ge(row_ptr, V, probe, floor, m, s2, BLOCK: tl.constexpr):
    """Sum of exp2((x - m) * s2) over the logits whose key is >= max(probe, floor)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + offs, mask=start + offs < V, other=float("-inf"))
        kx = _key(x)
        sel = (kx >= probe) & (kx >= floor) & (x > float("-inf"))
        acc += tl.where(sel, tl.exp2((x - m) * s2), 0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _sample_row_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, u_ptr, out_ptr, V, stride_row,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    s2 = 1.4426950408889634 / tl.load(temp_ptr + row)
    k = tl.load(topk_ptr + row)
    p = tl.load(topp_ptr + row)
    u = tl.load(u_ptr + row)
    offs = tl.arange(0, BLOCK)
    # pass 1: maximum and number of finite logits
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    nf = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + offs, mask=start + offs < V, other=float("-inf"))
        mx = tl.maximum(mx, x)
        nf += (x > float("-inf")).to(tl.int32)
    m = tl.max(mx, axis=0)
    n_fin = tl.sum(nf, axis=0)
    lowest = k * 0 - 2147483647 - 1
    # top-k: the largest key t with count(key >= t) >= k (binary search on the key space)
    t_k = lowest
    if (k < V) & (k < n_fin):
        lo = lowest
        hi = k * 0 + 2147483647
        for _ in range(32):
            if lo < hi:
                mid = (lo.to(tl.int64) + hi.to(tl.int64) + 1) // 2
                mid32 = mid.to(tl.int32)
                if _count_ge(row_ptr, V, mid32, BLOCK) >= k:
                    lo = mid32
                else:
                    hi = mid32 - 1
        t_k = lo
    # top-p: the largest key t (within the top-k set) with mass(key >= t) >= p * mass(top-k)
    t = t_k
    if p < 1.0:
        zk = _mass_ge(row_ptr, V, lowest, t_k, m, s2, BLOCK)
        target = p * zk
        lo = t_k
        hi = k * 0 + 2147483647
        for _ in range(32):
            if lo < hi:
                mid = (lo.to(tl.int64) + hi.to(tl.int64) + 1) // 2
                mid32 = mid.to(tl.int32)
                if _mass_ge(row_ptr, V, mid32, t_k, m, s2, BLOCK) >= target:
                    lo = mid32
                else:
                    hi = mid32 - 1
        t = lo
    # sample: inverse CDF over the kept logits in vocabulary order
    total = _mass_ge(row_ptr, V, t, lowest, m, s2, BLOCK)
    goal = u * total
    carry = u * 0.0
    found = row * 0 - 1
    last = found
    for start in range(0, V, BLOCK):
        idx = start + offs
        x = tl.load(row_ptr + idx, mask=idx < V, other=float("-inf"))
        w = tl.where((_key(x) >= t) & (x > float("-inf")), tl.exp2((x - m) * s2), 0.0)
        cum = tl.cumsum(w, axis=0) + carry
        hit = (cum > goal) & (w > 0.0)
        first = tl.min(tl.where(hit, idx, 2147483647), axis=0)
        if (found < 0) & (first < 2147483647):
            found = first.to(tl.int64)
        last = tl.maximum(last, tl.max(tl.where(w > 0.0, idx, -1), axis=0).to(tl.int64))
        carry = carry + tl.sum(w, axis=0)
    res = tl.where(found >= 0, found, last)
    tl.store(out_ptr + row, res)


def run(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
        uniforms: torch.Tensor) -> torch.Tensor:
    """Sample one id per request (see ``reference.run`` for the semantics).

    Args:
        logits: ``[B, V]`` float32, row stride any (unit column stride).
        temperature: ``[B]`` float32 (> 0); top_k: ``[B]`` int32 in [1, V];
        top_p: ``[B]`` float32 in (0, 1]; uniforms: ``[B]`` float32 in [0, 1).

    Returns:
        ``ids [B]`` int64.
    """
    B, V = logits.shape
    ids = torch.empty(B, dtype=torch.int64, device=logits.device)
    if B == 0:
        return ids
    block = 4096 if V >= 32768 else max(128, min(1024, triton.next_power_of_2(V)))
    _sample_row_kernel[(B,)](logits, temperature, top_k, top_p, uniforms, ids, V, logits.stride(0),
                             BLOCK=block, num_warps=8 if block >= 4096 else 4)
    return ids
