"""Block-FP8 fused MoE, straightforward Triton port (no expert design).

A competent direct translation of the unfused W8A8 MoE pipeline, one kernel per step and one
tile configuration for every shape (64 x 64 output tiles, K steps of 128 = the scale block):

1. quantise x: one program per (token, 128-group);
2. align: an atomic count per id, a one-program scan, an atomic scatter per id (three kernels;
   the sorted buffer pre-filled with the sentinel);
3. GEMM1 over 64-row tiles of the sorted order against w13[e] with block scales -> h [rows, 2I] bf16;
4. SiLU(gate) * up -> a [rows, I] bf16;
5. quantise a (the same kernel as step 1) -> a_q, a_s;
6. GEMM2 against w2[e] with block scales -> y [T k, H] bf16 at each assignment's row;
7. combine: out[t] = sum_j topk_weights[t, j] * y[t k + j] in FP32.

Shapes: ``x [T, H]`` bf16, ``w13 [E, 2I, H]`` e4m3 + ``w13_scale [E, 2I/128, H/128]``,
``w2 [E, H, I]`` e4m3 + ``w2_scale [E, H/128, I/128]``, ``topk_weights [T, k]`` fp32,
``topk_ids [T, k]`` int32 -> ``[T, H]`` bf16. No host synchronisation.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
QB = 128
BLOCK_M = 16 if _INTERPRET else 64
BLOCK_N = 64
ID_BLOCK = 256
ROWS = 16                                 # rows per program of the quantisation and SiLU kernels
EW_BLOCK = 128 if _INTERPRET else 1024    # columns per program of the elementwise kernels


@triton.jit
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, M, K, ROWS: tl.constexpr, QB: tl.constexpr):
    """1 x QB group g of ROWS rows: s = max(amax, 1e-10) / 448, q = e4m3(x / s)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    m = r < M
    offs = r.to(tl.int64)[:, None] * K + g * QB + tl.arange(0, QB)[None, :]
    v = tl.load(x_ptr + offs, mask=m[:, None], other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(v), axis=1), 1e-10) / 448.0
    tl.store(q_ptr + offs, tl.clamp(v / s[:, None], -448.0, 448.0).to(tl.float8e4nv), mask=m[:, None])
    tl.store(s_ptr + r.to(tl.int64) * (K // QB) + g, s, mask=m)


@triton.jit
def _histogram_kernel(ids_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    tl.atomic_add(counts_ptr + tl.load(ids_ptr + i, mask=ok, other=0), 1, mask=ok)


@triton.jit
def _offsets_kernel(counts_ptr, cursor_ptr, eids_ptr, ntpp_ptr, E, BM: tl.constexpr, E_PAD: tl.constexpr):
    """Exclusive scan of the padded counts (one program); the owner of every block."""
    ex = tl.arange(0, E_PAD)
    padded = (tl.load(counts_ptr + ex, mask=ex < E, other=0) + BM - 1) // BM * BM
    ends = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + ex, ends - padded, mask=ex < E)
    nb = tl.sum(padded, 0) // BM
    tl.store(ntpp_ptr, nb * BM)
    for b0 in range(0, nb, 32):
        b = b0 + tl.arange(0, 32)
        tl.store(eids_ptr + b, tl.sum((ends[None, :] <= (b * BM)[:, None]).to(tl.int32), axis=1), mask=b < nb)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    pos = tl.atomic_add(cursor_ptr + tl.load(ids_ptr + i, mask=ok, other=0), 1, mask=ok)
    tl.store(sorted_ptr + pos, i, mask=ok)


@triton.jit
def _block_fp8_gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, sorted_ptr, eids_ptr, ntpp_ptr,
                           n_valid, a_div, N, K, stride_be, stride_bse, stride_bsn,
                           GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr,
                           BM: tl.constexpr, BN: tl.constexpr, QB: tl.constexpr):
    """C[rows] = sum_kb as[row, kb] * bs[e, n // QB, kb] * (A[row, kb] . B[e, n, kb]) for one
    BM-row tile of the sorted order (expert e), BN columns; bf16 output.

    GATHER_A: A row of sorted row r is sorted[r] // a_div (token rows), else r.
    SCATTER_C: the C row is sorted[r] (assignment order, padding skipped), else r.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BM >= tl.load(ntpp_ptr):
        return
    rows = pid_m * BM + tl.arange(0, BM)
    slot = tl.load(sorted_ptr + rows)
    valid = slot < n_valid
    if GATHER_A:
        arow = tl.where(valid, slot // a_div, 0).to(tl.int64)
    else:
        arow = rows.to(tl.int64)
    e = tl.load(eids_ptr + pid_m).to(tl.int64)
    cols = pid_n * BN + tl.arange(0, BN)
    kk = tl.arange(0, QB)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, K // QB):
        a = tl.load(a_ptr + arow[:, None] * K + kb * QB + kk[None, :], mask=valid[:, None], other=0.0)
        b = tl.load(b_ptr + e * stride_be + cols[None, :].to(tl.int64) * K + kb * QB + kk[:, None])
        sa = tl.load(as_ptr + arow * (K // QB) + kb, mask=valid, other=0.0)
        sb = tl.load(bs_ptr + e * stride_bse + (cols // QB) * stride_bsn + kb)
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
    if SCATTER_C:
        crow = tl.where(valid, slot, 0).to(tl.int64)
        tl.store(c_ptr + crow[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=valid[:, None])
    else:
        tl.store(c_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], acc.to(tl.bfloat16))


@triton.jit
def _silu_mul_kernel(h_ptr, a_ptr, ntpp_ptr, I, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """a = silu(h[:, :I]) * h[:, I:] for ROWS rows below the padded total."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    if tl.program_id(0) * ROWS >= tl.load(ntpp_ptr):
        return
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c[None, :] < I
    base = r.to(tl.int64)[:, None] * 2 * I + c[None, :]
    g = tl.load(h_ptr + base, mask=m, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + base + I, mask=m, other=0.0).to(tl.float32)
    tl.store(a_ptr + r.to(tl.int64)[:, None] * I + c[None, :], (g * tl.sigmoid(g) * u).to(tl.bfloat16), mask=m)


@triton.jit
def _weighted_sum_kernel(y_ptr, tw_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(tw_ptr + t * TOPK + j) * tl.load(y_ptr + (t * TOPK + j) * H + c, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + c, acc.to(tl.bfloat16), mask=m)


def run(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Block-FP8 fused MoE (see the module docstring for shapes)."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    n = T * k
    dev = x.device
    x, ids, tw = x.contiguous(), topk_ids.contiguous(), topk_weights.contiguous()
    xq = torch.empty((T, H), dtype=torch.float8_e4m3fn, device=dev)
    xs = torch.empty((T, H // QB), dtype=torch.float32, device=dev)
    _group_quant_kernel[(triton.cdiv(T, ROWS), H // QB)](x, xq, xs, T, H, ROWS=ROWS, QB=QB)
    num_m = triton.cdiv(n + E * (BLOCK_M - 1), BLOCK_M)
    rows = num_m * BLOCK_M
    sorted_ids = torch.full((rows,), n, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_m, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    counts = torch.zeros(E, dtype=torch.int32, device=dev)
    cursor = torch.empty(E, dtype=torch.int32, device=dev)
    _histogram_kernel[(triton.cdiv(n, ID_BLOCK),)](ids, counts, n, BLOCK=ID_BLOCK)
    _offsets_kernel[(1,)](counts, cursor, expert_ids, ntpp, E, BM=BLOCK_M, E_PAD=triton.next_power_of_2(max(E, 2)))
    _scatter_kernel[(triton.cdiv(n, ID_BLOCK),)](ids, cursor, sorted_ids, n, BLOCK=ID_BLOCK)
    h = torch.empty((rows, 2 * I), dtype=torch.bfloat16, device=dev)
    _block_fp8_gemm_kernel[(num_m, 2 * I // BLOCK_N)](
        xq, xs, w13, w13_scale, h, sorted_ids, expert_ids, ntpp, n, k, 2 * I, H,
        w13.stride(0), w13_scale.stride(0), w13_scale.stride(1),
        GATHER_A=True, SCATTER_C=False, BM=BLOCK_M, BN=BLOCK_N, QB=QB, num_warps=4, num_stages=3)
    a = torch.empty((rows, I), dtype=torch.bfloat16, device=dev)
    _silu_mul_kernel[(rows // ROWS, triton.cdiv(I, EW_BLOCK))](h, a, ntpp, I, ROWS=ROWS, BLOCK=EW_BLOCK)
    aq = torch.empty((rows, I), dtype=torch.float8_e4m3fn, device=dev)
    a_s = torch.empty((rows, I // QB), dtype=torch.float32, device=dev)
    _group_quant_kernel[(rows // ROWS, I // QB)](a, aq, a_s, rows, I, ROWS=ROWS, QB=QB)
    y = torch.empty((n, H), dtype=torch.bfloat16, device=dev)
    _block_fp8_gemm_kernel[(num_m, H // BLOCK_N)](
        aq, a_s, w2, w2_scale, y, sorted_ids, expert_ids, ntpp, n, 1, H, I,
        w2.stride(0), w2_scale.stride(0), w2_scale.stride(1),
        GATHER_A=False, SCATTER_C=True, BM=BLOCK_M, BN=BLOCK_N, QB=QB, num_warps=4, num_stages=3)
    out = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
    _weighted_sum_kernel[(T, triton.cdiv(H, EW_BLOCK))](y, tw, out, H, TOPK=k, BLOCK=EW_BLOCK)
    return out
