"""Fused MoE (BF16), straightforward Triton port (no expert design).

A competent direct translation of the standard sorted grouped-GEMM MoE, one kernel per step
and one tile configuration for every shape:

1. align: per-id atomic counts, a one-program scan, a per-id atomic scatter (three kernels,
   the sorted buffer pre-filled with the sentinel);
2. GEMM1 over BLOCK_M-row tiles of the sorted order against w13[e] -> cache1 [rows, 2I];
3. SiLU(gate) * up -> cache2 [rows, I] (rows past the padded total skipped);
4. GEMM2 against w2[e] -> cache3 [T k, H] at each assignment's row;
5. combine: out[t] = sum_j topk_weights[t, j] * cache3[t k + j] in FP32.

Shapes: ``x [T, H]``, ``w13 [E, 2I, H]``, ``w2 [E, H, I]``, ``topk_weights [T, k]`` fp32,
``topk_ids [T, k]`` int32 -> ``[T, H]`` in x's dtype. No host synchronisation.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_M = 16 if _INTERPRET else 64
BLOCK_N = 32 if _INTERPRET else 64
BLOCK_K = 32
ID_BLOCK = 256 if _INTERPRET else 1024


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    tl.atomic_add(counts_ptr + e, 1, mask=m)


@triton.jit
def _scan_kernel(counts_ptr, cursor_ptr, eids_ptr, ntpp_ptr, num_experts, block_size,
                 E_PAD: tl.constexpr, EID_TILE: tl.constexpr):
    ex = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + ex, mask=ex < num_experts, other=0)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + ex, ends - padded, mask=ex < num_experts)
    total = tl.sum(padded, 0)
    tl.store(ntpp_ptr, total)
    for b0 in range(0, total // block_size, EID_TILE):
        b = b0 + tl.arange(0, EID_TILE)
        owner = tl.sum((ends[None, :] <= (b * block_size)[:, None]).to(tl.int32), axis=1)
        tl.store(eids_ptr + b, owner, mask=b < total // block_size)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    slot = tl.atomic_add(cursor_ptr + e, 1, mask=m)
    tl.store(sorted_ptr + slot, offs, mask=m)


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, sorted_ptr, eids_ptr, ntpp_ptr,
                         n_valid, a_row_div, N, K, stride_a, stride_be, stride_bn, stride_c,
                         GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C[rows] = A[rows] @ B[e]^T for one BM-row tile of the sorted order (expert e).

    GATHER_A: A row of sorted row r is a_ptr[sorted[r] // a_row_div] (token rows), else row r.
    SCATTER_C: C row is sorted[r] (assignment order; padding rows skipped), else row r.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BM >= tl.load(ntpp_ptr):
        return
    rows = pid_m * BM + tl.arange(0, BM)
    slot = tl.load(sorted_ptr + rows)
    valid = slot < n_valid
    if GATHER_A:
        arow = tl.where(valid, slot // a_row_div, 0).to(tl.int64)
    else:
        arow = rows.to(tl.int64)
    e = tl.load(eids_ptr + pid_m).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + arow[:, None] * stride_a + kk[None, :], mask=valid[:, None] & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + e * stride_be + rn[None, :].to(tl.int64) * stride_bn + kk[:, None],
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    if SCATTER_C:
        crow = tl.where(valid, slot, 0).to(tl.int64)
        cmask = valid[:, None] & (rn[None, :] < N)
    else:
        crow = rows.to(tl.int64)
        cmask = rn[None, :] < N
    tl.store(c_ptr + crow[:, None] * stride_c + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def _silu_mul_kernel(c1_ptr, c2_ptr, ntpp_ptr, I, stride_c1, stride_c2, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if row >= tl.load(ntpp_ptr):
        return
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(c1_ptr + row * stride_c1 + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(c1_ptr + row * stride_c1 + I + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(c2_ptr + row * stride_c2 + cols, (g * tl.sigmoid(g) * u).to(c2_ptr.dtype.element_ty), mask=m)


@triton.jit
def _combine_kernel(c3_ptr, tw_ptr, out_ptr, H, stride_c3, stride_out, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        w = tl.load(tw_ptr + t * TOPK + j)
        acc += w * tl.load(c3_ptr + (t * TOPK + j) * stride_c3 + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=m)


def run(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """Fused MoE (see the module docstring for shapes)."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    n = T * k
    dev = x.device
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
    num_m = triton.cdiv(n + E * (BLOCK_M - 1), BLOCK_M)
    rows = num_m * BLOCK_M
    sorted_ids = torch.full((rows,), n, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_m, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    counts = torch.zeros(E, dtype=torch.int32, device=dev)
    cursor = torch.empty(E, dtype=torch.int32, device=dev)
    E_PAD = triton.next_power_of_2(max(E, 2))
    _count_kernel[(triton.cdiv(n, ID_BLOCK),)](ids, counts, n, BLOCK=ID_BLOCK)
    _scan_kernel[(1,)](counts, cursor, expert_ids, ntpp, E, BLOCK_M, E_PAD=E_PAD, EID_TILE=max(2, min(64, 8192 // E_PAD)))
    _scatter_kernel[(triton.cdiv(n, ID_BLOCK),)](ids, cursor, sorted_ids, n, BLOCK=ID_BLOCK)
    c1 = torch.empty((rows, 2 * I), dtype=x.dtype, device=dev)
    _grouped_gemm_kernel[(num_m, triton.cdiv(2 * I, BLOCK_N))](
        x, w13, c1, sorted_ids, expert_ids, ntpp, n, k, 2 * I, H, x.stride(0), w13.stride(0), w13.stride(1),
        c1.stride(0), GATHER_A=True, SCATTER_C=False, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K, num_warps=4, num_stages=3)
    c2 = torch.empty((rows, I), dtype=x.dtype, device=dev)
    _silu_mul_kernel[(rows, triton.cdiv(I, 1024))](c1, c2, ntpp, I, c1.stride(0), c2.stride(0), BLOCK=1024)
    c3 = torch.empty((n, H), dtype=x.dtype, device=dev)
    _grouped_gemm_kernel[(num_m, triton.cdiv(H, BLOCK_N))](
        c2, w2, c3, sorted_ids, expert_ids, ntpp, n, 1, H, I, c2.stride(0), w2.stride(0), w2.stride(1),
        c3.stride(0), GATHER_A=False, SCATTER_C=True, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K, num_warps=4, num_stages=3)
    out = torch.empty((T, H), dtype=x.dtype, device=dev)
    _combine_kernel[(T, triton.cdiv(H, 1024))](c3, tw, out, H, c3.stride(0), out.stride(0), TOPK=k, BLOCK=1024)
    return out
