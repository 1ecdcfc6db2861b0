"""Expert Triton solution: multi-LoRA shrink + expand grouped by adapter (SGMV), per-regime tiles.

Contract (identical to ``reference.run``)
------------------------------------------
``run(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale)``: ``x [T, K]``,
``y [T, N]`` (updated in place), ``lora_a [S, L, R, K]``, ``lora_b [L, N, R]`` (bf16; fp16/fp32
on CPU smoke runs), ``slice_offsets [S + 1]`` int32, ``token_lora_mapping [T]`` int32 (-1: no
adapter), ``scale`` float. For each token t with adapter l >= 0 and each column n of
slice s: ``y[t, n] += scale * (x[t] @ lora_a[s, l].T) @ lora_b[l, n]``; rows of tokens
without an adapter are never read or written.

Design
------
L1 -- group the tokens by adapter once; two skinny GEMMs per adapter.
    A counting sort of the mapping (:func:`_group_kernel`) lists the tokens of every adapter
    contiguously (adapter-less tokens are left out). Every BM-row tile of that order belongs
    to ONE adapter, so each program multiplies a tile of gathered token rows by that adapter's
    weights: an adapter's A and B cross HBM once per call (then from L2 for its other row
    tiles) instead of once per token (BGMV). The same order serves the shrink and the
    expand and every slice.
    Shrink ``h = x A^T`` has N = S R (16-128): it is bound by reading x and A, so it is
    parallelised over K (split-K, FP32 atomics into a zeroed buffer) when there are too few
    row tiles to fill the SMs. All S slices' A rows of an adapter form one [S R, K] operand,
    so every x row is read once for all slices. Expand ``y += scale (h B^T)`` has K = R (one
    MMA k-step): it is bound by y's read-modify-write and B; the add into y is its epilogue.
L2 -- dataflow.
    The sort writes sorted token ids and per-adapter counts (two launches at prefill, one at
    decode: per-chunk histograms, then each chunk's exclusive offsets and in-chunk ranks; stable,
    no atomics); extra programs of its first launch zero the FP32 shrink buffer meanwhile. Shrink and expand programs derive their
    tile's adapter and rows from the counts ([L] values: a cumsum in registers); the grids are
    sized for the static worst case cdiv(T, BM) + L tiles and surplus programs exit at once,
    so the call has no host synchronisation (CUDA-graph safe). The buffer [T, S R] is indexed by
    sorted position, so the expand reads it as contiguous rows and gathers only y's rows.
L3 -- per-regime tiles.
    Decode (few tokens per adapter): 16-row tiles, split-K so that about two shrink programs run
    per SM, wide B tiles in the expand. Prefill (hundreds of tokens per adapter): 64-row tiles,
    split-K only where K is long (Llama-70B down_proj, K = 28672). The expand finds the slice
    of its column block from slice_offsets on the device; a block that straddles a slice
    boundary takes one MMA per slice it touches, with the other columns masked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: Tokens per program of the grouping sort.
CHUNK = 64 if _INTERPRET else 256
#: Rows of the FP32 shrink buffer zeroed per extra program of the sort launch.
ZERO_ROWS = 32

_SM_COUNT: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


@triton.jit
def _group_kernel(map_ptr, hist_ptr, sorted_ptr, counts_ptr, buf_ptr, T, L, C, buf_cols,
                  CH: tl.constexpr, LP: tl.constexpr, CP: tl.constexpr, BC: tl.constexpr, ZR: tl.constexpr,
                  PHASE: tl.constexpr, ZERO: tl.constexpr):
    """Counting sort of the tokens by adapter. Program c owns tokens [c CH, (c + 1) CH).

    PHASE 0: one program does everything (C == 1). PHASE 1: per-chunk histograms into
    hist [C, LP]. PHASE 2: exclusive offsets of this chunk per adapter (from all histograms),
    in-chunk ranks, scatter into sorted_ids; program 0 writes counts [LP]. Tokens with
    adapter -1 are left out. ZERO (PHASE 0 or 1): programs c >= C of the launch zero the FP32
    shrink buffer, ZR rows each, in parallel with the sort."""
    c = tl.program_id(0)
    if c >= C:
        if ZERO:
            zrows = (c - C) * ZR + tl.arange(0, ZR)
            cols = tl.arange(0, BC)
            for c0 in range(0, buf_cols, BC):
                ptrs = buf_ptr + zrows[:, None].to(tl.int64) * buf_cols + c0 + cols[None, :]
                tl.store(ptrs, tl.zeros([ZR, BC], dtype=tl.float32),
                         mask=(zrows < T)[:, None] & ((c0 + cols) < buf_cols)[None, :])
        return
    offs = c * CH + tl.arange(0, CH)
    m = tl.load(map_ptr + offs, mask=offs < T, other=-1)
    valid = (offs < T) & (m >= 0)
    lanes = tl.arange(0, LP)
    onehot = ((m[:, None] == lanes[None, :]) & valid[:, None]).to(tl.int32)     # [CH, LP]
    if PHASE == 1:
        tl.store(hist_ptr + c * LP + lanes, tl.sum(onehot, axis=0))
    else:
        if PHASE == 0:
            counts = tl.sum(onehot, axis=0)
            before = tl.zeros([LP], dtype=tl.int32)
        else:
            rows = tl.arange(0, CP)
            hist = tl.load(hist_ptr + rows[:, None] * LP + lanes[None, :], mask=(rows < C)[:, None], other=0)
            counts = tl.sum(hist, axis=0)
            before = tl.sum(tl.where((rows < c)[:, None], hist, 0), axis=0)
        starts = tl.cumsum(counts, 0) - counts
        rank = tl.sum((tl.cumsum(onehot, 0) - onehot) * onehot, axis=1)
        base = tl.sum(onehot * (starts + before)[None, :], axis=1)
        tl.store(sorted_ptr + base + rank, offs, mask=valid)
        if c == 0:
            tl.store(counts_ptr + lanes, counts)


@triton.jit
def _tile_of(counts_ptr, j, L, BM: tl.constexpr, LP: tl.constexpr):
    """Adapter, first sorted row and end row of row tile j (adapter L: past the last tile)."""
    lanes = tl.arange(0, LP)
    cnt = tl.load(counts_ptr + lanes, mask=lanes < L, other=0)
    ntiles = (cnt + BM - 1) // BM
    tends = tl.cumsum(ntiles, 0)
    ends = tl.cumsum(cnt, 0)
    lora = tl.sum((tends <= j).to(tl.int32), axis=0)
    sel = lanes == lora
    tstart = tl.sum(tl.where(sel, tends - ntiles, 0), axis=0)
    start = tl.sum(tl.where(sel, ends - cnt, 0), axis=0)
    end = tl.sum(tl.where(sel, ends, 0), axis=0)
    return lora, start + (j - tstart) * BM, end


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, buf_ptr, sorted_ptr, counts_ptr, L, K, k_per_split, SR,
                   stride_xt, stride_as, stride_al, stride_ar,
                   R: tl.constexpr, SRP: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                   LP: tl.constexpr, ATOMIC: tl.constexpr):
    """buf[p, s R + r] (+)= x[tok(p)] . lora_a[s, l, r] over this program's K range, for the BM
    sorted positions p of row tile program_id(0) (adapter l) and all S slices at once."""
    j = tl.program_id(0)
    lora, row0, row_end = _tile_of(counts_ptr, j, L, BM, LP)
    if lora >= L:
        return
    rows = row0 + tl.arange(0, BM)
    rmask = rows < row_end
    tok = tl.load(sorted_ptr + rows, mask=rmask, other=0).to(tl.int64)
    q = tl.arange(0, SRP)
    qmask = q < SR
    a_rows = (q // R).to(tl.int64) * stride_as + lora.to(tl.int64) * stride_al + (q % R) * stride_ar
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    rk = tl.arange(0, BK)
    x_ptrs = x_ptr + tok[:, None] * stride_xt + (k_lo + rk)[None, :]
    a_ptrs = a_ptr + a_rows[None, :] + (k_lo + rk)[:, None]
    acc = tl.zeros((BM, SRP), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        kin = (k0 + rk) < k_hi
        xt = tl.load(x_ptrs, mask=rmask[:, None] & kin[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=kin[:, None] & qmask[None, :], other=0.0)
        acc = tl.dot(xt, at, acc)
        x_ptrs += BK
        a_ptrs += BK
    b_ptrs = buf_ptr + rows[:, None].to(tl.int64) * SR + q[None, :]
    omask = rmask[:, None] & qmask[None, :]
    if ATOMIC:
        tl.atomic_add(b_ptrs, acc, mask=omask, sem="relaxed")
    else:
        tl.store(b_ptrs, acc, mask=omask)


@triton.jit
def _expand_kernel(buf_ptr, b_ptr, y_ptr, sorted_ptr, counts_ptr, offs_ptr, scale, L, N, S, SR,
                   stride_bl, stride_bn, stride_yt,
                   R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, LP: tl.constexpr, SP: tl.constexpr):
    """y[tok(p), n] += scale * (buf[p, s R : s R + R] . lora_b[l, n]) for the BM sorted positions
    p of row tile program_id(0) and BN columns n (slice s of each column from slice_offsets)."""
    j = tl.program_id(0)
    lora, row0, row_end = _tile_of(counts_ptr, j, L, BM, LP)
    if lora >= L:
        return
    rows = row0 + tl.arange(0, BM)
    rmask = rows < row_end
    tok = tl.load(sorted_ptr + rows, mask=rmask, other=0).to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    nmask = cols < N
    # slice of every column: the number of inner slice boundaries at or before it
    sb = tl.arange(0, SP)
    bounds = tl.load(offs_ptr + 1 + sb, mask=sb < S - 1, other=2147483647)
    col_slice = tl.sum((cols[:, None] >= bounds[None, :]).to(tl.int32), axis=1)
    s_first = tl.min(tl.where(nmask, col_slice, S), axis=0)
    s_last = tl.max(tl.where(nmask, col_slice, 0), axis=0)
    rr = tl.arange(0, R)
    b_base = b_ptr + lora.to(tl.int64) * stride_bl + cols[None, :].to(tl.int64) * stride_bn + rr[:, None]
    h_base = buf_ptr + rows[:, None].to(tl.int64) * SR + rr[None, :]
    y_ptrs = y_ptr + tok[:, None] * stride_yt + cols[None, :]
    ymask = rmask[:, None] & nmask[None, :]
    yv = tl.load(y_ptrs, mask=ymask, other=0.0)          # issued before the products: independent of them
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for s in range(s_first, s_last + 1):
        h = tl.load(h_base + s * R, mask=rmask[:, None], other=0.0)
        bt = tl.load(b_base, mask=(nmask & (col_slice == s))[None, :], other=0.0)
        acc = tl.dot(h.to(bt.dtype), bt, acc)
    out = yv.to(tl.float32) + acc * scale
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=ymask)


@dataclass(frozen=True)
class LoraConfig:
    """Tiles of one call, chosen from the shapes only (never from the data).

    ``bm``: rows per tile (shrink and expand share the tile list); ``bk`` / ``split`` /
    ``warps_s`` / ``stages_s``: the shrink's K step, K splits and launch settings; ``bn`` /
    ``warps_e`` / ``stages_e``: the expand's column block and launch settings."""

    bm: int
    bk: int
    split: int
    bn: int
    warps_s: int = 4
    stages_s: int = 3
    warps_e: int = 4
    stages_e: int = 2


def config_for(T: int, K: int, N: int, R: int, L: int, S: int, sms: int) -> LoraConfig:
    """Per-regime tiles from the expected tokens per adapter (T / L)."""
    per = T / max(L, 1)
    if _INTERPRET:
        bm = 16 if per < 48 else 32
        tiles = L * triton.cdiv(max(int(per), 1), bm)
        split = 2 if K >= 128 and tiles < 8 else 1
        return LoraConfig(bm, 32, split, 32, 1, 1, 1, 1)
    decode = per < 48
    bm = 16 if decode else 64
    tiles = L * triton.cdiv(max(int(per), 1), bm)
    bk = 128 if decode else 64
    split = 1
    while tiles * split < 2 * sms and K // (split * 2) >= 4 * bk and split < 64:
        split *= 2
    bn = 128
    return LoraConfig(bm, bk, split, bn, 4, 4 if decode else 3, 4, 2)


def run(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
        token_lora_mapping: torch.Tensor, scale: float) -> None:
    """Multi-LoRA shrink + expand into ``y`` in place (shapes in the module docstring); no host
    synchronisation."""
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    cfg = config_for(T, K, N, R, L, S, _num_sms(x.device))
    lora_shrink_expand(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale, cfg)


def lora_shrink_expand(x, y, lora_a, lora_b, slice_offsets, token_lora_mapping, scale, cfg: LoraConfig) -> None:
    """:func:`run` with an explicit :class:`LoraConfig` (tests and GPU tuning sweeps)."""
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    if T == 0:
        return
    dev = x.device
    x, lora_a, lora_b = x.contiguous(), lora_a.contiguous(), lora_b.contiguous()
    mapping = token_lora_mapping.contiguous()
    SR = S * R
    LP = max(16, triton.next_power_of_2(L))
    C = triton.cdiv(T, CHUNK)
    atomic = cfg.split > 1
    sorted_ids = torch.empty(T, dtype=torch.int32, device=dev)
    counts = torch.empty(LP, dtype=torch.int32, device=dev)
    buf = torch.empty((T, SR), dtype=torch.float32, device=dev)
    hist = torch.empty((C, LP), dtype=torch.int32, device=dev) if C > 1 else counts
    meta = dict(CH=CHUNK, LP=LP, CP=max(2, triton.next_power_of_2(C)), BC=min(128, triton.next_power_of_2(SR)),
                ZR=ZERO_ROWS, ZERO=atomic, num_warps=4)
    gargs = (mapping, hist, sorted_ids, counts, buf, T, L, C, SR)
    zero_programs = triton.cdiv(T, ZERO_ROWS) if atomic else 0
    if C == 1:
        _group_kernel[(1 + zero_programs,)](*gargs, PHASE=0, **meta)
    else:
        _group_kernel[(C + zero_programs,)](*gargs, PHASE=1, **meta)
        _group_kernel[(C,)](*gargs, PHASE=2, **meta)
    max_tiles = triton.cdiv(T, cfg.bm) + L
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split), cfg.bk) * cfg.bk
    _shrink_kernel[(max_tiles, triton.cdiv(K, k_per_split))](
        x, lora_a, buf, sorted_ids, counts, L, K, k_per_split, SR,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), lora_a.stride(2),
        R=R, SRP=max(16, triton.next_power_of_2(SR)), BM=cfg.bm, BK=cfg.bk, LP=LP, ATOMIC=atomic,
        num_warps=cfg.warps_s, num_stages=cfg.stages_s)
    _expand_kernel[(max_tiles, triton.cdiv(N, cfg.bn))](
        buf, lora_b, y, sorted_ids, counts, slice_offsets, scale, L, N, S, SR,
        lora_b.stride(0), lora_b.stride(1), y.stride(0),
        R=R, BM=cfg.bm, BN=cfg.bn, LP=LP, SP=max(2, triton.next_power_of_2(S)),
        num_warps=cfg.warps_e, num_stages=cfg.stages_e)
