"""Expert Triton solution: fused MoE (BF16) as a sorted, block-padded grouped GEMM.

Contract (identical to ``reference.run``)
------------------------------------------
``run(x, w13, w2, topk_weights, topk_ids)``: ``x [T, H]``, ``w13 [E, 2I, H]`` (gate rows,
then up rows), ``w2 [E, H, I]`` (bf16; fp16 on CPU smoke runs), ``topk_weights [T, k]``
float32, ``topk_ids [T, k]`` int32 -> ``out [T, H]`` in x's dtype with
``out[t] = sum_j w[t,j] * w2[e] @ (silu(w13[e][:I] @ x[t]) * (w13[e][I:] @ x[t]))``,
``e = topk_ids[t, j]``; GEMMs accumulate in FP32, the activation is rounded to x's dtype.

Design
------
L1 -- sort, pad, grouped GEMM; fuse everything that is elementwise.
    The n = T k (token, expert) assignments are counting-sorted by expert and every expert's
    segment is padded to BLOCK_M rows (:func:`_align_kernel`, the moe_align_block_size
    design), so that each BLOCK_M-row tile of the sorted order belongs to ONE expert and is a
    dense GEMM tile against that expert's weights, which are read once per tile column
    instead of once per token.  Token rows are gathered on the fly through the sorted ids
    (no permuted copy of x).  GEMM1 computes the gate and the up columns of the same
    intermediate indices in one program (two accumulators) and applies SiLU(gate) * up in
    its epilogue, so the 2I-wide pre-activation never reaches memory; GEMM2 multiplies each
    row by its routing weight in its epilogue; a light kernel sums the k weighted rows of
    every token in a fixed order (deterministic).  Decode (few tokens per expert) is weight
    streaming: every active expert's 3 H I weights are read once; prefill is a tensor-core
    bound grouped GEMM.

L2 -- dataflow.
    cache2 [EM, I] holds the activation in *sorted* order (row r of the padded layout), so
    GEMM2 reads its A tiles as contiguous rows, no gather; cache3 [T k, H] holds the weighted
    expert outputs at the assignment's own row t k + j, so the combine reads k contiguous rows
    per token.  Grids are sized for the static worst case (n + E (BLOCK_M - 1) rows);
    programs whose tile starts at or after num_tokens_post_padded (read on the device) exit
    at once: no host synchronisation, CUDA-graph safe.  A grouped tile order (GROUP_M
    row-tiles per column sweep) keeps one expert's weight tiles in L2 while all its row
    tiles use them.

L3 -- per-regime tiles, swap_ab at decode.
    Tile shapes are chosen from the shapes only (expected tokens per active expert):
    prefill uses 128-row tiles with 8 warps and a 4-stage software pipeline (wgmma); at decode
    (<= 32 tokens per expert) the GEMMs are computed transposed (C^T = W X^T): the many
    weight rows fill the MMA's M dimension and the few tokens sit in N (16), so the
    tensor cores are not padded 8x, and the weight-tile width is chosen so that enough
    programs stream weights to cover every SM.  int64 offsets for the expert weight bases and
    token rows; masks on ragged K/N edges.  Prefill with small experts (Qwen3-MoE, I = 768)
    uses 128 x 256 output tiles (GEMM1: 128 gate + 128 up columns; GEMM2: 256 columns): fewer
    operand bytes per FLOP from L2 than 128 x 128; Mixtral-sized experts keep 128 x 128.

    Decode with about one token per expert (T k small and at most ~10 % of the assignments
    sharing an expert, e.g. batch 1): every row tile of the sorted order would hold one
    assignment, so sorting buys no weight reuse and its worst-case grids are >90 % empty
    programs.  There the layer is two launches and nothing else: GEMM1 per (assignment,
    column tile) straight from topk_ids (each selected expert's gate/up weights stream once,
    transposed tensor-core tiles), then GEMM2 with the combine fused: one program per (token,
    8 output columns) loads those columns' weight rows of all k experts as one tile (a GEMV
    on CUDA cores, all k experts' loads in flight at once) and sums the routing-weighted dot
    products in FP32 with fixed-shape reductions (deterministic). GEMM2 is a programmatic
    dependent launch (PDL, sm_90): GEMM1 lets it start as soon as all GEMM1 programs run,
    and it loads its first weight tile before waiting for GEMM1's results, so its start
    overlaps GEMM1's tail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# align schedule (see moe_align_block_size): one program up to SINGLE_MAX assignments
SINGLE_MAX = 1024
SUB = 32
NSUB = 4 if _INTERPRET else 16
COUNT_TILE = 256 if _INTERPRET else 1024
SLICE_QUANTUM = 64 if _INTERPRET else 512
ALIGN_WARPS = 8
#: Fewest expert bins (padding experts receive nothing; see align()).
MIN_E_PAD = 32

_SM_COUNT: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, eids_ptr, ntpp_ptr, ws_ptr,
                  n, chunk, num_experts, block_size,
                  E_PAD: tl.constexpr, COUNT_TILE: tl.constexpr, NSUB: tl.constexpr, SUB: tl.constexpr,
                  PAD_E: tl.constexpr, PAD_B: tl.constexpr, EID_TILE: tl.constexpr,
                  PHASE: tl.constexpr, SINGLE: tl.constexpr):
    """Counting sort of ``n`` expert ids with block padding.

    PHASE 0 (one program, SINGLE): everything; 1: counts only; 2: scan and scatter only.
    ``ws_ptr`` int32 workspace: counts[E_PAD] | cursors[E_PAD], zero-initialised by the caller
    unless SINGLE (then only the cursors are used, and this program initialises them).  Program ``p`` owns ids ``[p*chunk, min((p+1)*chunk, n))``.
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lo = pid * chunk
    hi = tl.minimum(lo + chunk, n)
    ex = tl.arange(0, E_PAD)
    cursor_ptr = ws_ptr + E_PAD

    # ---- phase 1: per-program histogram in registers, one vector atomic into the counts
    if PHASE != 2:
        hist = tl.zeros([E_PAD], dtype=tl.int32)
        for start in range(lo, hi, COUNT_TILE):
            offs = start + tl.arange(0, COUNT_TILE)
            e = tl.load(ids_ptr + offs, mask=offs < hi, other=0)
            hist += tl.histogram(e, E_PAD)
        masked = tl.cdiv(hi - lo, COUNT_TILE) * COUNT_TILE - (hi - lo)  # masked lanes landed in bin 0
        hist -= tl.where(ex == 0, masked, 0)
        if not SINGLE:
            tl.atomic_add(ws_ptr + ex, hist, mask=hist > 0)
    # ---- phase 2: scan of the padded counts (each program, redundantly), then scatter
    if PHASE != 1:
        if SINGLE:
            counts = hist
            tl.atomic_xchg(cursor_ptr + ex, tl.zeros([E_PAD], dtype=tl.int32))
            tl.debug_barrier()
        else:
            counts = tl.load(ws_ptr + ex, volatile=True)
        counts = tl.where(ex < num_experts, counts, 0)
        padded = (counts + block_size - 1) // block_size * block_size
        ends = tl.cumsum(padded, 0)
        starts = ends - padded
        total = tl.sum(padded, 0)
        if pid == 0:
            tl.store(ntpp_ptr, total)
        # expert_ids: the owner of block b is the number of segments ending at or before b*B
        nb = total // block_size
        for b0 in range(pid * EID_TILE, nb, nprog * EID_TILE):
            b = b0 + tl.arange(0, EID_TILE)
            owner = tl.sum((ends[None, :] <= (b * block_size)[:, None]).to(tl.int32), axis=1)
            tl.store(eids_ptr + b, owner, mask=b < nb)
        # sentinel in the padding slots [start + count, start + padded) of each expert
        j = tl.arange(0, PAD_B)
        for e0 in range(pid * PAD_E, num_experts, nprog * PAD_E):
            er = e0 + tl.arange(0, PAD_E)
            er = tl.where(er < num_experts, er, 0)
            st = tl.gather(starts, er, 0)
            slot = st[:, None] + tl.gather(counts, er, 0)[:, None] + j[None, :]
            end = st + tl.gather(padded, er, 0)
            ok = ((e0 + tl.arange(0, PAD_E)) < num_experts)[:, None] & (slot < end[:, None])
            tl.store(sorted_ptr + slot, n, mask=ok)
        # scatter: rank inside SUB-wide sub-tiles, one atomic per (sub-tile, expert) group
        sub = tl.arange(0, SUB)
        before = sub[None, None, :] < sub[None, :, None]          # partner j precedes i
        starts2 = tl.broadcast_to(starts[None, :], (NSUB, E_PAD))
        for start in range(lo, hi, NSUB * SUB):
            offs = start + tl.arange(0, NSUB)[:, None] * SUB + sub[None, :]
            m = offs < hi
            e = tl.load(ids_ptr + offs, mask=m, other=-1)
            eq = (e[:, :, None] == e[:, None, :]) & m[:, None, :]
            rank = tl.sum((eq & before).to(tl.int32), axis=2)
            size = tl.sum(eq.to(tl.int32), axis=2)
            lead = m & (rank == 0)
            es = tl.where(m, e, 0)
            old = tl.atomic_add(cursor_ptr + es, size, mask=lead)
            old = tl.where(lead, old, 0)
            base = tl.sum(tl.where(eq, old[:, None, :], 0), axis=2)
            slot = tl.gather(starts2, es, 1) + base + rank
            tl.store(sorted_ptr + slot, offs, mask=m)



@triton.jit
def _tile_coords(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share each column sweep (weight tiles stay in L2)."""
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _gemm1_silu_kernel(x_ptr, w13_ptr, c2_ptr, sorted_ptr, eids_ptr, ntpp_ptr,
                       n_valid, top_k, H, I, num_m,
                       stride_xt, stride_we, stride_wn, stride_c2,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                       SWAP: tl.constexpr):
    """cache2[r, i] = silu(x[tok(r)] . w13[e, i]) * (x[tok(r)] . w13[e, I + i]) for the rows r of
    one BM-row tile of the sorted, padded order (expert e = expert_ids[tile]) and BN columns i.
    Padding rows (sorted id >= n_valid) read zeros. SWAP computes the transposed tiles."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_coords(pid, num_m, tl.cdiv(I, BN), GROUP_M)
    if pid_m * BM >= tl.load(ntpp_ptr):
        return
    rows = pid_m * BM + tl.arange(0, BM)
    slot = tl.load(sorted_ptr + rows)
    valid = slot < n_valid
    tok = tl.where(valid, slot // top_k, 0).to(tl.int64)
    e = tl.load(eids_ptr + pid_m).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < I
    rk = tl.arange(0, BK)
    w_base = w13_ptr + e * stride_we
    if SWAP:  # weights [BN, BK] x tokens^T [BK, BM] -> [BN, BM]
        wg_ptrs = w_base + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
        x_ptrs = x_ptr + tok[None, :] * stride_xt + rk[:, None]
        acc_g = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    else:     # tokens [BM, BK] x weights^T [BK, BN] -> [BM, BN]
        wg_ptrs = w_base + rn[None, :].to(tl.int64) * stride_wn + rk[:, None]
        x_ptrs = x_ptr + tok[:, None] * stride_xt + rk[None, :]
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    wu_off = I * stride_wn
    for k0 in range(0, H, BK):
        kin = (k0 + rk) < H
        if SWAP:
            wmask = nmask[:, None] & kin[None, :]
            xt = tl.load(x_ptrs, mask=valid[None, :] & kin[:, None], other=0.0)
            wg = tl.load(wg_ptrs, mask=wmask, other=0.0)
            wu = tl.load(wg_ptrs + wu_off, mask=wmask, other=0.0)
            acc_g += tl.dot(wg, xt)
            acc_u += tl.dot(wu, xt)
        else:
            wmask = kin[:, None] & nmask[None, :]
            xa = tl.load(x_ptrs, mask=valid[:, None] & kin[None, :], other=0.0)
            wg = tl.load(wg_ptrs, mask=wmask, other=0.0)
            wu = tl.load(wg_ptrs + wu_off, mask=wmask, other=0.0)
            acc_g += tl.dot(xa, wg)
            acc_u += tl.dot(xa, wu)
        x_ptrs += BK
        wg_ptrs += BK
    act = (acc_g * tl.sigmoid(acc_g) * acc_u).to(c2_ptr.dtype.element_ty)
    rows64 = rows.to(tl.int64)
    if SWAP:
        tl.store(c2_ptr + rows64[None, :] * stride_c2 + rn[:, None], act, mask=nmask[:, None])
    else:
        tl.store(c2_ptr + rows64[:, None] * stride_c2 + rn[None, :], act, mask=nmask[None, :])


@triton.jit
def _gemm2_weighted_kernel(c2_ptr, w2_ptr, c3_ptr, tw_ptr, sorted_ptr, eids_ptr, ntpp_ptr,
                           n_valid, H, I, num_m,
                           stride_c2, stride_we, stride_wn, stride_c3,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                           SWAP: tl.constexpr):
    """cache3[a, h] = topk_weight[a] * (cache2[r] . w2[e, h]) for the assignment a held by each
    row r of one BM-row tile of the sorted order and BN output columns h (padding rows skipped)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _tile_coords(pid, num_m, tl.cdiv(H, BN), GROUP_M)
    if pid_m * BM >= tl.load(ntpp_ptr):
        return
    rows = pid_m * BM + tl.arange(0, BM)
    rows64 = rows.to(tl.int64)
    slot = tl.load(sorted_ptr + rows)
    valid = slot < n_valid
    e = tl.load(eids_ptr + pid_m).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < H
    rk = tl.arange(0, BK)
    w_base = w2_ptr + e * stride_we
    if SWAP:
        w_ptrs = w_base + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
        a_ptrs = c2_ptr + rows64[None, :] * stride_c2 + rk[:, None]
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        w_ptrs = w_base + rn[None, :].to(tl.int64) * stride_wn + rk[:, None]
        a_ptrs = c2_ptr + rows64[:, None] * stride_c2 + rk[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        kin = (k0 + rk) < I
        if SWAP:
            at = tl.load(a_ptrs, mask=kin[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=nmask[:, None] & kin[None, :], other=0.0)
            acc += tl.dot(w, at)
        else:
            a = tl.load(a_ptrs, mask=kin[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=kin[:, None] & nmask[None, :], other=0.0)
            acc += tl.dot(a, w)
        a_ptrs += BK
        w_ptrs += BK
    wt = tl.load(tw_ptr + slot, mask=valid, other=0.0)
    slot64 = tl.where(valid, slot, 0).to(tl.int64)
    if SWAP:
        y = (acc * wt[None, :]).to(c3_ptr.dtype.element_ty)
        tl.store(c3_ptr + slot64[None, :] * stride_c3 + rn[:, None], y, mask=nmask[:, None] & valid[None, :])
    else:
        y = (acc * wt[:, None]).to(c3_ptr.dtype.element_ty)
        tl.store(c3_ptr + slot64[:, None] * stride_c3 + rn[None, :], y, mask=valid[:, None] & nmask[None, :])


@triton.jit
def _combine_kernel(c3_ptr, out_ptr, H, stride_c3, stride_out, TOPK: tl.constexpr, BH: tl.constexpr):
    """out[t, h] = sum_j cache3[t k + j, h] in FP32, in fixed order j = 0 .. k-1."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    m = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(c3_ptr + (t * TOPK + j) * stride_c3 + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _decode_gemm1_kernel(x_ptr, w13_ptr, ids_ptr, c2_ptr, top_k, H, I,
                         stride_xt, stride_we, stride_wn, stride_c2,
                         BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, PDL: tl.constexpr):
    """Decode (about one token per expert): c2[a, i] = silu(w13[e, i] . x[t]) * (w13[e, I + i] . x[t])
    for assignment a = t k + j, e = topk_ids[a], and BN columns i. One program per (assignment,
    column tile): no sort, no padding tiles, no empty programs. Transposed MMA (weights in M,
    the single token in a BT-wide N of which only column 0 is loaded). PDL: lets the next launch
    (GEMM2, which reads only weights before its grid-dependency wait) start as soon as every
    program of this one has started."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    num_n = tl.cdiv(I, BN)
    a = pid // num_n
    pid_n = pid % num_n
    e = tl.load(ids_ptr + a).to(tl.int64)
    t = (a // top_k).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < I
    rk = tl.arange(0, BK)
    col0 = tl.arange(0, BT) == 0
    wg_ptrs = w13_ptr + e * stride_we + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    x_ptrs = x_ptr + t * stride_xt + rk[:, None] + tl.zeros((1, BT), dtype=tl.int32)
    acc_g = tl.zeros((BN, BT), dtype=tl.float32)
    acc_u = tl.zeros((BN, BT), dtype=tl.float32)
    wu_off = I * stride_wn
    for k0 in range(0, H, BK):
        kin = (k0 + rk) < H
        wmask = nmask[:, None] & kin[None, :]
        xt = tl.load(x_ptrs, mask=kin[:, None] & col0[None, :], other=0.0)
        wg = tl.load(wg_ptrs, mask=wmask, other=0.0)
        wu = tl.load(wg_ptrs + wu_off, mask=wmask, other=0.0)
        acc_g = tl.dot(wg, xt, acc_g)
        acc_u = tl.dot(wu, xt, acc_u)
        x_ptrs += BK
        wg_ptrs += BK
    act = (acc_g * tl.sigmoid(acc_g) * acc_u).to(c2_ptr.dtype.element_ty)
    c_ptrs = c2_ptr + a.to(tl.int64) * stride_c2 + rn[:, None] + tl.zeros((1, BT), dtype=tl.int32)
    tl.store(c_ptrs, act, mask=nmask[:, None] & col0[None, :])


@triton.jit
def _decode_gemv2_combine_kernel(c2_ptr, w2_ptr, ids_ptr, tw_ptr, out_ptr, top_k, H, I,
                                 stride_c2, stride_we, stride_wn, stride_out,
                                 KP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    """Decode GEMM2 + combine on CUDA cores (one token: a GEMV per expert):
    out[t, h] = sum_j topk_weight[t, j] * (w2[e_j, h] . c2[t k + j]) for BN columns h, with the
    weight rows of all k experts in ONE [KP, BN, BK] tile (KP = k rounded up to a power of two,
    rows j >= k masked), so that a program has every expert's loads in flight instead of
    walking the experts one after the other. Each K step requests the next step's weight tile
    before its own FMAs (one tile ahead: Triton's pipeliner does not stage loads that feed no
    tl.dot) and accumulates w * c2 elementwise in FP32; after the K loop the tile is reduced
    over K, scaled by the routing weights and reduced over j. Both reductions have a fixed
    shape, hence a fixed order: deterministic. PDL: the first weight tile (weights, ids and
    routing weights only, which GEMM1 does not write) is loaded before the grid-dependency
    wait, the c2 activations after it, so this launch overlaps GEMM1's tail."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(H, BN)
    t = pid // num_n
    pid_n = pid % num_n
    rj = tl.arange(0, KP)
    jm = rj < top_k
    a = t * top_k + rj
    e = tl.load(ids_ptr + a, mask=jm, other=0).to(tl.int64)
    wt = tl.load(tw_ptr + a, mask=jm, other=0.0)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < H
    rk = tl.arange(0, BK)
    w_ptrs = (w2_ptr + e[:, None, None] * stride_we + rn[None, :, None].to(tl.int64) * stride_wn
              + rk[None, None, :])
    c_ptrs = c2_ptr + a[:, None].to(tl.int64) * stride_c2 + rk[None, :]
    rowm = jm[:, None, None] & nmask[None, :, None]
    acc = tl.zeros((KP, BN, BK), dtype=tl.float32)
    w = tl.load(w_ptrs, mask=rowm & (rk < I)[None, None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    for k0 in range(0, I, BK):
        kin = (k0 + rk) < I
        c = tl.load(c_ptrs, mask=jm[:, None] & kin[None, :], other=0.0)
        w_ptrs += BK
        w_next = tl.load(w_ptrs, mask=rowm & ((k0 + BK + rk) < I)[None, None, :], other=0.0)
        acc += w.to(tl.float32) * c.to(tl.float32)[:, None, :]
        w = w_next
        c_ptrs += BK
    y = tl.sum(acc, axis=2) * wt[:, None]
    o = tl.sum(y, axis=0)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + rn, o.to(out_ptr.dtype.element_ty), mask=nmask)


@dataclass(frozen=True)
class MoEConfig:
    """Tile configuration of one call (chosen from the shapes only, never from the data).

    ``direct``: the decode path (no sort): GEMM1 tiles are (assignment, bn1 columns) with
    ``bk``, ``warps``, ``stages``, block_m being the MMA's token width there (one valid
    column); the GEMM2+combine tiles are (token, bn2 columns of every one of its k experts)
    with ``bk2``, ``warps2``, ``stages2``; ``pdl``: GEMM2 is a programmatic dependent launch
    (sm_90+, outside the interpreter). group_m and swap are unused there."""

    block_m: int
    bn1: int
    bn2: int
    bk: int
    group_m: int
    swap: bool
    warps: int
    stages: int
    direct: bool = False
    bk2: int = 0
    warps2: int = 0
    stages2: int = 0
    pdl: bool = False


def _pick_bn(active_tiles: float, n_cols: int, sms: int, choices=(128, 64, 32, 16)) -> int:
    """Widest weight tile that still gives about two programs per SM."""
    for bn in choices:
        if active_tiles * triton.cdiv(n_cols, bn) >= 2 * sms:
            return bn
    return choices[-1]


def config_for(T: int, H: int, I: int, E: int, k: int, sms: int) -> MoEConfig:
    """Per-regime tiles from the expected tokens per active expert (uniform routing)."""
    n = T * k
    active = E * (1.0 - (1.0 - k / E) ** T)
    per_expert = n / max(active, 1.0)
    # Decode with about one token per active expert (at most ~10 % of the assignments share an
    # expert; T = 1 shares none): sorting and padding buy no weight reuse there, so the layer
    # is two launches, no align, no combine; every selected expert's weights stream once.
    direct = n <= 256 and per_expert <= 1.1
    if _INTERPRET:
        if direct:
            return MoEConfig(16, 16, 4, 32, 1, True, 1, 1, True, 32, 1, 1, pdl=True)
        if per_expert <= 32:
            return MoEConfig(16, 16, 16, 32, 1, True, 1, 1)
        return MoEConfig(32, 32, 32, 32, 2, False, 1, 1)
    if direct:
        # GEMM1: enough (assignment, column-tile) programs for >= 2 per SM. 16-row weight tiles
        # use 2 warps (4 warps would each re-read the whole 16-row MMA operand from shared memory).
        bn1 = _pick_bn(n, I, sms, (64, 32, 16))
        # GEMM2 + combine: (token, 8 output columns) programs of 8 warps, each K step a
        # [k, 8, 256] weight tile (32 KB at k = 8) plus the one requested ahead; Qwen3-30B-A3B
        # batch 1: 256 programs, 125 registers, all resident at once. Measured on the H200
        # (graph-timed, 64 calls per replay): the former tensor-core GEMM2 walking the 8
        # experts in turn 27.0 us per layer (GEMM2 12.5 us of it); this GEMV 25.0 us (4
        # columns x 4 warps 26.6, 16 x 8 26.7, 8 x 4 with 128-deep steps 25.0); with PDL
        # 22.5 us. Not kept: two tiles ahead instead of one (26.6 us with PDL), a CUDA-core
        # GEMV1 (slower alone, 26.4 us vs 25.0; equal with PDL).
        return MoEConfig(16, bn1, 8, 128, 1, True, 4 if bn1 >= 32 else 2, 4, True, 256, 8, 1, pdl=True)
    if per_expert <= 32:   # decode: weight streaming, transposed tiles
        tiles = active * triton.cdiv(max(int(per_expert), 1), 16)
        # GEMM1 streams two weight tiles (gate, up) per stage: at most 64 rows each, so that four
        # stages of 2 x 64 x 128 bf16 weights plus the token tile fit in shared memory
        return MoEConfig(16, _pick_bn(tiles, I, sms, (64, 32, 16)), _pick_bn(tiles, H, sms), 128, 1, True, 4, 4)
    if per_expert <= 96:
        return MoEConfig(64, 64, 128, 64, 8, False, 4, 4)
    if I <= 4096:
        # Prefill with small experts (Qwen3-MoE, I = 768): 128 x 256 output tiles (gate 128 + up
        # 128 in GEMM1, 256 output columns in GEMM2): 48 KB of operands per 64-deep K step feed
        # 4.2 MFLOP instead of 32 KB per 2.1 MFLOP at 128 x 128 (L2->SM traffic per FLOP -25 %).
        return MoEConfig(128, 128, 256, 64, 8, False, 8, 4)
    return MoEConfig(128, 64, 128, 64, 8, False, 8, 4)


def run(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """Fused MoE: ``x [T, H]``, ``w13 [E, 2I, H]``, ``w2 [E, H, I]``, ``topk_weights [T, k]``
    fp32, ``topk_ids [T, k]`` int32 -> ``[T, H]`` in x's dtype (no host synchronisation)."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    cfg = config_for(T, H, I, E, k, _num_sms(x.device))
    return fused_moe(x, w13, w2, topk_weights, topk_ids, cfg)


def fused_moe(x, w13, w2, topk_weights, topk_ids, cfg: MoEConfig) -> torch.Tensor:
    """:func:`run` with an explicit :class:`MoEConfig` (tests and the GPU tuning sweep)."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    n = T * k
    dev = x.device
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    ids = topk_ids.contiguous()
    tw = topk_weights.contiguous()
    if cfg.direct:
        return _fused_moe_direct(x, w13, w2, tw, ids, cfg)
    BM = cfg.block_m
    # 1. align: counting sort of the assignments into BM-padded expert segments
    length = n + E * (BM - 1)
    num_m = triton.cdiv(length, BM)
    sorted_ids = torch.empty(num_m * BM, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_m, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    # At least MIN_E_PAD bins: triton 3.6 cannot compile the [NSUB, E_PAD] tl.gather of the scatter
    # when NSUB * E_PAD < the program's threads (assertion `isWarpLocal` in
    # OptimizeThreadLocality; e.g. Mixtral's E = 8 with 8 warps). Bins >= E stay empty.
    E_PAD = max(triton.next_power_of_2(E), MIN_E_PAD)
    single = n <= SINGLE_MAX
    if single:
        chunk, P = max(n, 1), 1
        ws = torch.empty(2 * E_PAD, dtype=torch.int32, device=dev)
    else:
        per = triton.cdiv(n, _num_sms(dev))
        chunk = triton.cdiv(per, SLICE_QUANTUM) * SLICE_QUANTUM
        P = triton.cdiv(n, chunk)
        ws = torch.zeros(2 * E_PAD, dtype=torch.int32, device=dev)
    meta = dict(E_PAD=E_PAD, COUNT_TILE=COUNT_TILE, NSUB=NSUB, SUB=SUB,
                PAD_E=max(2, min(16, 4096 // triton.next_power_of_2(BM))), PAD_B=triton.next_power_of_2(BM),
                EID_TILE=max(2, min(64, 8192 // E_PAD)), SINGLE=single, num_warps=ALIGN_WARPS)
    aargs = (ids, sorted_ids, expert_ids, ntpp, ws, n, chunk, E, BM)
    if single:
        _align_kernel[(1,)](*aargs, PHASE=0, **meta)
    else:
        _align_kernel[(P,)](*aargs, PHASE=1, **meta)
        _align_kernel[(P,)](*aargs, PHASE=2, **meta)
    # 2. GEMM1 with the SiLU * up epilogue, into cache2 (sorted order)
    c2 = torch.empty((num_m * BM, I), dtype=x.dtype, device=dev)
    grid1 = (num_m * triton.cdiv(I, cfg.bn1),)
    _gemm1_silu_kernel[grid1](x, w13, c2, sorted_ids, expert_ids, ntpp, n, k, H, I, num_m,
                              x.stride(0), w13.stride(0), w13.stride(1), c2.stride(0),
                              BM=BM, BN=cfg.bn1, BK=cfg.bk, GROUP_M=cfg.group_m, SWAP=cfg.swap,
                              num_warps=cfg.warps, num_stages=cfg.stages)
    # 3. GEMM2 with the routing-weight epilogue, into cache3 (assignment order)
    c3 = torch.empty((n, H), dtype=x.dtype, device=dev)
    grid2 = (num_m * triton.cdiv(H, cfg.bn2),)
    _gemm2_weighted_kernel[grid2](c2, w2, c3, tw, sorted_ids, expert_ids, ntpp, n, H, I, num_m,
                                  c2.stride(0), w2.stride(0), w2.stride(1), c3.stride(0),
                                  BM=BM, BN=cfg.bn2, BK=cfg.bk, GROUP_M=cfg.group_m, SWAP=cfg.swap,
                                  num_warps=cfg.warps, num_stages=cfg.stages)
    # 4. combine: fixed-order k-sum per token
    out = torch.empty((T, H), dtype=x.dtype, device=dev)
    BH = 128 if _INTERPRET else 1024
    _combine_kernel[(T, triton.cdiv(H, BH))](c3, out, H, c3.stride(0), out.stride(0), TOPK=k, BH=BH,
                                             num_warps=4)
    return out


def _pdl_ok(device: torch.device) -> bool:
    """Programmatic dependent launch (griddepcontrol) needs sm_90+; never in the interpreter."""
    return not _INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _fused_moe_direct(x, w13, w2, tw, ids, cfg: MoEConfig) -> torch.Tensor:
    """Decode path: GEMM1 per (assignment, column tile) into c2 [T k, I] (assignment order), then
    GEMM2 with the weighted k-sum per (token, column tile) straight into out. Two launches;
    with ``pdl`` the second is a programmatic dependent launch: before its grid-dependency
    wait it reads only w2, topk_ids and topk_weights (never written by GEMM1, and complete
    before GEMM1 started), after it c2; out is written after the wait."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = ids.shape[1]
    n = T * k
    dev = x.device
    c2 = torch.empty((n, I), dtype=x.dtype, device=dev)
    pdl = cfg.pdl and _pdl_ok(dev)
    launch = {"launch_pdl": True} if pdl else {}
    _decode_gemm1_kernel[(n * triton.cdiv(I, cfg.bn1),)](
        x, w13, ids, c2, k, H, I, x.stride(0), w13.stride(0), w13.stride(1), c2.stride(0),
        BN=cfg.bn1, BK=cfg.bk, BT=cfg.block_m, PDL=pdl, num_warps=cfg.warps, num_stages=cfg.stages)
    out = torch.empty((T, H), dtype=x.dtype, device=dev)
    _decode_gemv2_combine_kernel[(T * triton.cdiv(H, cfg.bn2),)](
        c2, w2, ids, tw, out, k, H, I, c2.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        KP=triton.next_power_of_2(k), BN=cfg.bn2, BK=cfg.bk2, PDL=pdl,
        num_warps=cfg.warps2, num_stages=cfg.stages2, **launch)
    return out
