"""Expert Triton solution: packed variable-length causal GQA attention (FlashAttention varlen).

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k, v, cu_seqlens, max_seqlen, scale)`` with ``q: [T, Hq, D]``, ``k, v: [T, Hkv, D]``
(bf16; fp16 on the CPU smoke workloads), ``cu_seqlens: [N + 1]`` int32 on the device and
``max_seqlen`` a host int, returns ``(o [T, Hq, D], lse [Hq, T] float32)``.

Design
------
L1 -- no padding, flat tile space, longest first.
    The work is ``sum_s L_s^2 / 2``, never ``N * max_L^2 / 2``: the programs are exactly the
    (sequence, query tile) pairs that exist. Every tile runs the FlashAttention online softmax
    (running max and sum, rescaled fp32 accumulator, exp2 with ``scale * log2(e)`` folded into
    one FFMA per score) and stops its key loop at the diagonal. The G query heads of one KV head
    are packed into the rows of one tile, so a tile of a short sequence still fills a 128-row
    MMA and every K/V tile brought on chip serves the whole group.

L2 -- schedule built on the device every call.
    A one-wave pre-kernel reads ``cu_seqlens`` and writes the tile list: sequences ordered by
    their number of tiles (longest first, ties by index), the tiles of one sequence adjacent,
    from the last (longest causal range) to the first. A sequence's first list slot is the sum
    of the tile counts of the sequences ahead of it, computed by every program for its own block
    of sequences against all the others (no sort, no host synchronisation: the call is CUDA-graph
    capturable and the list is rebuilt from the current lengths on every call). Unused slots at
    the end of the list (the launch is sized from shapes only: ``cdiv(T, P) + N`` tiles) are
    marked empty and their programs exit at once.
    The attention kernel's program ``p`` takes list slot ``p // Hkv`` and KV head ``p % Hkv``:
    longest-processing-time first (the expensive tiles of long sequences start first; the tail
    of the schedule is made of the shortest sequences' cheapest tiles), and consecutive tiles of
    one sequence and KV head run close in time, so their common K/V prefix is read from L2.
    Within a tile: Q resident, ``m``, ``l`` and the accumulator in registers, P cast straight into
    the second MMA, one normalisation in the epilogue; only ``o`` and ``lse`` are written, at their
    packed offsets.

L3 -- Hopper mapping.
    At D <= 128: 128-row packed tiles (``128 / G`` positions x G heads) on 8 warps (two
    warpgroups of 64 rows, the wgmma M granularity) with 64-key tiles, the key loop
    software-pipelined over three K/V buffers (``tl.range(num_stages=3)`` on a kernel compiled
    with two stages, which keeps the wgmma pipelined); one loop whose causal mask sits behind a
    branch taken only on the band tiles; keys beyond the sequence end masked at load time (a
    predicated async copy: loads never cross into the next sequence or past T). sm_90 (ptxas):
    178 registers (211 at G = 5), 128 KB shared memory, no spills. gqa_flash_prefill measured
    this tile within 2-8% of its 256-row, 16-warp winner on the H200; here the 256-row tile
    spills (16-88 B of stack: the sequence bookkeeping and the non-power-of-two group of 5 push
    it past the 128-register cap of 512 threads). The tile is fixed per (D, G) rather than
    autotuned, because the schedule depends on it.
    Scalar base offsets in int64 (``cu_seqlens[s] * stride``); per-row offsets inside a sequence
    in int32; one scalar K/V tile pointer advanced per iteration plus loop-invariant int32
    offsets (no loop-carried 64-bit pointer tensors).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
#: Sequences per program of the schedule kernel (rows of its comparison block).
SCHED_ROWS = 64
#: Sequences compared per step of the schedule kernel (columns of its comparison block).
SCHED_COLS = 64


def tile_config(D: int, G: int) -> dict:
    """Tile of the attention kernel for head dim ``D`` and group size ``G`` (positions per tile
    ``P = BLOCK_M // G``; the schedule is built for that ``P``).

    D <= 128: 128 rows on 8 warps, 64-key tiles, three K/V buffers in the key loop (no spills
    for groups of 4, 5 and 8; the 256-row, 16-warp tile spills here, see the module docstring);
    D = 64: the same rows on 4 warps; D = 256: 128 rows on 8 warps, two K/V buffers (the
    accumulator doubles). The CPU interpreter gets a small tile.

    Raises:
        ValueError: ``G`` larger than the tile's rows.
    """
    if _INTERPRET:
        cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "LOOP_STAGES": 0, "ONE_LOOP": 1, "num_warps": 1, "num_stages": 1}
    elif D <= 64:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "LOOP_STAGES": 3, "ONE_LOOP": 1, "num_warps": 4, "num_stages": 2}
    elif D <= 128:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "LOOP_STAGES": 3, "ONE_LOOP": 1, "num_warps": 8, "num_stages": 2}
    else:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "LOOP_STAGES": 0, "ONE_LOOP": 1, "num_warps": 8, "num_stages": 2}
    if G > cfg["BLOCK_M"]:
        raise ValueError(f"GQA group of {G} query heads exceeds the {cfg['BLOCK_M']}-row tile")
    return cfg


@triton.jit
def _schedule_kernel(CU, TILES, N, n_slots, P: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Tile list in longest-processing-time order. Program ``pid`` handles sequences
    ``[pid * ROWS, pid * ROWS + ROWS)``; sequence ``s`` with ``n_s = cdiv(L_s, P)`` tiles gets
    the slots ``start_s .. start_s + n_s - 1`` (tile ``n_s - 1`` first), where ``start_s`` sums
    ``n_t`` over the sequences ``t`` ahead of it (``n_t > n_s``, or equal and ``t < s``).
    ``TILES[0, slot]`` is the sequence (-1: empty slot), ``TILES[1, slot]`` the tile index.
    Program 0 also marks the slots past the total as empty."""
    pid = tl.program_id(0)
    s = pid * ROWS + tl.arange(0, ROWS)
    s_ok = s < N
    b0 = tl.load(CU + s, mask=s_ok, other=0)
    b1 = tl.load(CU + s + 1, mask=s_ok, other=0)
    n_s = tl.where(s_ok, (b1 - b0 + P - 1) // P, 0)
    start = tl.zeros([ROWS], dtype=tl.int32)
    total = 0
    for c0 in range(0, N, COLS):
        c = c0 + tl.arange(0, COLS)
        c_ok = c < N
        n_c = tl.where(c_ok, (tl.load(CU + c + 1, mask=c_ok, other=0) - tl.load(CU + c, mask=c_ok, other=0)
                              + P - 1) // P, 0)
        ahead = (n_c[None, :] > n_s[:, None]) | ((n_c[None, :] == n_s[:, None]) & (c[None, :] < s[:, None]))
        start += tl.sum(tl.where(ahead, n_c[None, :], 0), axis=1)
        total += tl.sum(n_c, axis=0)
    for t in range(0, tl.max(n_s, axis=0)):
        ok = t < n_s
        tl.store(TILES + start + t, s, mask=ok)
        tl.store(TILES + n_slots + start + t, n_s - 1 - t, mask=ok)
    if pid == 0:
        for e0 in range(total, n_slots, COLS):
            e = e0 + tl.arange(0, COLS)
            tl.store(TILES + e, tl.full([COLS], -1, tl.int32), mask=e < n_slots)


@triton.jit
def _online_step(qk, acc, m_i, l_i, qk_scale, v_ptrs, kn, L, MASK_KEYS: tl.constexpr):
    """One online-softmax step on a tile of raw scores ``qk`` (masked entries -inf): the row max in
    scaled log2 units (taken on the raw scores: the scale is positive), one FFMA and one exp2 per
    score, the V tile loaded after the exponentials (the pipelined loop then waits for K before
    QK^T and for V only before PV); keys >= L load as zeros when MASK_KEYS. Returns acc, m, l."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASK_KEYS:
        v = tl.load(v_ptrs, mask=kn[:, None] < L, other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _varlen_attn_kernel(
    Q, K, V, O, LSE, CU, TILES,
    qk_scale,                      # scale * log2(e), fp32
    T, n_slots,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr, ONE_LOOP: tl.constexpr,
):
    """One program = one tile of the LPT list (``P = BLOCK_M // GROUP`` positions of one
    sequence x the GROUP query heads of one KV head). Row ``r`` is local position
    ``start + r // GROUP`` of query head ``kvh * GROUP + r % GROUP`` (in THD the GROUP heads of one
    token are one contiguous run). Keys are the sequence's positions ``0 .. end - 1``; the
    causal mask is applied on the band tiles only; loads stop at the sequence end."""
    P: tl.constexpr = BLOCK_M // GROUP
    pid = tl.program_id(0)
    slot = pid // HKV
    kvh = pid % HKV
    seq = tl.load(TILES + slot)
    if seq < 0:
        return
    tile = tl.load(TILES + n_slots + slot)
    bos = tl.load(CU + seq)
    L = tl.load(CU + seq + 1) - bos
    bos64 = bos.to(tl.int64)
    start_m = tile * P
    end_m = tl.minimum(start_m + P, L)
    band_n = (start_m // BLOCK_N) * BLOCK_N   # first key tile that can cross the diagonal

    r = tl.arange(0, BLOCK_M)
    pos = start_m + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < P * GROUP) & (pos < L)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + bos64 * stride_qt + pos[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_offs = offs_n[:, None] * stride_kt + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vt + offs_d[None, :]
    k_tile = K + bos64 * stride_kt + kvh.to(tl.int64) * stride_kh
    v_tile = V + bos64 * stride_vt + kvh.to(tl.int64) * stride_vh
    if ONE_LOOP:
        # every key tile in one software-pipelined loop; loads bounded by the sequence end
        for start_n in tl.range(0, end_m, BLOCK_N, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
            kn = start_n + offs_n
            k = tl.load(k_tile + k_offs, mask=kn[:, None] < L, other=0.0)
            qk = tl.dot(q, tl.trans(k))
            if start_n >= band_n:      # band tile: causal mask (it also hides keys >= L from real rows)
                qk = tl.where(pos[:, None] >= kn[None, :], qk, float("-inf"))
            acc, m_i, l_i = _online_step(qk, acc, m_i, l_i, qk_scale, v_tile + v_offs, kn, L, True)
            k_tile += BLOCK_N * stride_kt
            v_tile += BLOCK_N * stride_vt
    else:
        # tiles below the band: every key exists and precedes every row (no mask, no bounds)
        for start_n in tl.range(0, band_n, BLOCK_N, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
            k = tl.load(k_tile + k_offs)
            qk = tl.dot(q, tl.trans(k))
            acc, m_i, l_i = _online_step(qk, acc, m_i, l_i, qk_scale, v_tile + v_offs, offs_n, L, False)
            k_tile += BLOCK_N * stride_kt
            v_tile += BLOCK_N * stride_vt
        # the band: causal mask, loads bounded by the sequence end
        for start_n in range(band_n, end_m, BLOCK_N):
            kn = start_n + offs_n
            k = tl.load(k_tile + k_offs, mask=kn[:, None] < L, other=0.0)
            qk = tl.dot(q, tl.trans(k))
            qk = tl.where(pos[:, None] >= kn[None, :], qk, float("-inf"))
            acc, m_i, l_i = _online_step(qk, acc, m_i, l_i, qk_scale, v_tile + v_offs, kn, L, True)
            k_tile += BLOCK_N * stride_kt
            v_tile += BLOCK_N * stride_vt

    # row maps recomputed here rather than kept live across the key loop (registers)
    pos = start_m + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < P * GROUP) & (pos < L)
    out = acc * (1.0 / l_i)[:, None]
    tl.store(O + bos64 * stride_ot + pos[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453      # ln(2): log2 -> natural log
    tl.store(LSE + bos64 + head * T + pos, lse, mask=row_ok)     # head * T < Hq * T: the LSE's size


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen causal GQA attention forward.

    Args:
        q: ``[T, Hq, D]`` bf16/fp16, unit stride on D.
        k, v: ``[T, Hkv, D]``, q's dtype, unit stride on D; ``Hq % Hkv == 0``.
        cu_seqlens: ``[N + 1]`` int32 device offsets (never read on the host).
        max_seqlen: longest sequence (host int; unused: the launch is sized from ``T`` and ``N``).
        scale: softmax scale.

    Returns:
        ``o [T, Hq, D]`` (q's dtype) and ``lse [Hq, T]`` float32 (natural log).

    Raises:
        ValueError: inconsistent shapes, a head dim that is not a power of two in [16, 256], or a
            GQA group larger than the tile.
    """
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    N = cu_seqlens.shape[0] - 1
    if Hq % Hkv or k.shape != (T, Hkv, D) or v.shape != k.shape or N < 1:
        raise ValueError(f"bad shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} "
                         f"cu_seqlens {tuple(cu_seqlens.shape)}")
    if D not in (16, 32, 64, 128, 256) or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("head dim must be a power of two in [16, 256] with unit stride")
    G = Hq // Hkv
    cfg = tile_config(D, G)
    P = cfg["BLOCK_M"] // G
    n_slots = triton.cdiv(T, P) + N            # >= sum_s cdiv(L_s, P) for any lengths summing to T
    o = torch.empty_like(q)
    lse = torch.empty((Hq, T), device=q.device, dtype=torch.float32)
    tiles = torch.empty((2, n_slots), device=q.device, dtype=torch.int32)
    _schedule_kernel[(triton.cdiv(N, SCHED_ROWS),)](cu_seqlens, tiles, N, n_slots, P=P, ROWS=SCHED_ROWS,
                                                     COLS=SCHED_COLS, num_warps=4)
    _varlen_attn_kernel[(n_slots * Hkv,)](
        q, k, v, o, lse, cu_seqlens, tiles, scale * LOG2E, T, n_slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        HKV=Hkv, GROUP=G, HEAD_DIM=D, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        LOOP_STAGES=cfg["LOOP_STAGES"], ONE_LOOP=cfg["ONE_LOOP"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return o, lse
