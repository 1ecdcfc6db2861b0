"""Expert Triton solution: causal GQA FlashAttention backward (FA2-style, Hopper-tuned).

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k, v, o, lse, do, scale)`` with ``q, o, do: [B, S, Hq, D]``, ``k, v: [B, S, Hkv, D]``
(bf16; fp16 on the CPU smoke workloads; contiguous BSHD, ``Hq % Hkv == 0``) and ``lse [B, Hq, S]``
float32 (natural log) returns ``(dq [B, S, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, D])`` in q's
dtype.

Design
------
L1 -- recompute P from the LSE; delta pre-pass; causal tile skipping; KV-owner programs.
    No S x S tensor exists: every kernel rebuilds its tile of P = exp(scale q.k - lse) from Q, K
    and the saved per-row lse. ``delta = rowsum(dO * O)`` is computed once by a small pre-pass
    (O(S D) per head), so the main loops never need row sums of P * dP. Tiles above the diagonal
    are never visited (half the work). dK and dV of a KV tile are owned by one program, which
    accumulates them in registers over every later query tile of **all G query heads of its
    group** (K and V loaded once; no per-query-head dK/dV tensors, no group sum afterwards, no
    atomics). dQ of a query tile gets contributions from every earlier KV tile: a second kernel
    owns query tiles and recomputes P (two extra MMAs per tile pair) instead of fp32 atomic
    adds into a dq accumulator (deterministic, no zeroing or conversion pass, nothing to race).
    The atomic variant is here too (``DQ_ATOMIC_MODE``, off until measured on the H200): the
    dK/dV kernel then also forms dS K_n per tile pair and adds it to a float32 accumulator that the
    pre-pass zeroes; a conversion kernel scales and rounds it (five MMAs per pair instead of
    seven, at the cost of BLOCK_M x D atomic adds per pair).

L2 -- dataflow.
    dK/dV kernel: a program = (b, KV head, key tile n); K_n, V_n stay on chip; dK_n, dV_n are fp32
    register accumulators. For each query head of the group and each query tile m >= n it loads
    Q_m, dO_m, lse_m, delta_m, forms the transposed scores K_n Q_m^T so that P^T comes out
    directly (no transpose through shared memory), dV += P^T dO, dP^T = V dO^T,
    dS^T = P^T (dP^T - delta), dK += dS^T Q. The diagonal tiles (m overlapping n) run in their own
    short loop with the causal select; the long loop over the later tiles carries none.
    dQ kernel: a program = (b, query head, query tile m); Q_m, dO_m, lse_m, delta_m stay on chip,
    dQ_m accumulates in fp32 over the key tiles before the band (unmasked loop) and the band
    (masked loop). Both kernels fold ``scale`` and ``log2(e)`` into one FFMA per score
    (P = exp2(qk * scale log2 e - lse log2 e)) and apply ``scale`` to dK and dQ once, in the
    epilogue.

L3 -- Hopper mapping.
    dK/dV: BLOCK_N = 128 keys x BLOCK_M = 64 query rows per step with 8 warps (two fp32 128 x D
    accumulators dominate the register file); dQ: the mirror, 128 query rows x 64 keys. Both
    fp32-accumulating ``tl.dot`` (wgmma), K/V (Q/dO) loads software-pipelined over the inner
    loop. Program order (1-D grid): the tile index is the slowest coordinate and the longest
    tiles come first (key tile 0 has the most query tiles; the last query tile the most key
    tiles): LPT, the short programs fill the tail. In the dQ kernel the G heads of a KV group
    are adjacent programs (their K/V tiles hit in L2). Base offsets in int64; scalar tile
    pointers advanced per iteration plus loop-invariant int32 offset tensors. A short autotune
    list per kernel (keyed by S, D, G) picks the tile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634

#: (BLOCK_M, BLOCK_N, num_warps, num_stages) candidates of the dK/dV kernel (BLOCK_N keys owned,
#: BLOCK_M query rows per step; BLOCK_N a multiple of BLOCK_M) and of the dQ kernel (BLOCK_M
#: query rows owned, BLOCK_N keys per step; BLOCK_M a multiple of BLOCK_N). The autotuner picks
#: one per (S, D, G) on the first call. sm_90 resources at D = 128 (devtools/compile_sm90.py,
#: ptxas): dK/dV (64, 128, 8, 2) 128 KB shared memory, 255 registers and 152 B of stack (the most
#: MMA work per streamed Q/dO tile; kept because a small spill outside the MMAs may still win);
#: (32, 128, 8, 3) 113 KB, 242 registers, no spills; (32, 128, 8, 2) 96 KB, 249 registers, no
#: spills. (64, 64, 4, 3) spilled 360 B and (64, 64, 8, 2) 8 B with half the keys per program:
#: dropped. dQ (128, 64, 8, 2) 128 KB, 217 registers; (128, 64, 8, 3) 160 KB, 194 registers;
#: (128, 32, 8, 3) 112 KB, 142 registers; none spills ((128, 128, 8, 2) spilled 24 B: dropped).
#: Not yet timed on the H200.
_DKDV_CONFIGS = [(64, 128, 8, 2), (32, 128, 8, 3), (32, 128, 8, 2)]
_DQ_CONFIGS = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3)]

#: dQ mode. False (default): the separate dQ kernel recomputes P and dP (seven MMAs per causal
#: tile pair, no atomics, deterministic). True: the dK/dV kernel also forms dQ_m += dS K_n and adds
#: it to a float32 accumulator with relaxed atomics (five MMAs per pair; the pre-pass zeroes the
#: accumulator, a conversion kernel applies the scale and rounds). Which is faster on the H200 at
#: D = 128 is to be measured (the atomic traffic to L2 is BLOCK_M x D x 4 bytes per tile pair);
#: ``_atomic_dq`` applies it to every shape when set.
DQ_ATOMIC_MODE = False
#: (BLOCK_M, BLOCK_N, num_warps, num_stages) of the dK/dV kernel in the atomic mode (its extra
#: BLOCK_M x D fp32 product needs registers: the narrow query step).
_ATOMIC_DKDV_CONFIG = (32, 128, 8, 2)


def _atomic_dq(S: int, D: int, G: int) -> bool:
    """Whether a shape takes the atomic dQ mode (see :data:`DQ_ATOMIC_MODE`)."""
    return DQ_ATOMIC_MODE


def _configs(table):
    if _INTERPRET:  # one small config: the interpreter runs every program in Python
        bm, bn = (16, 32) if table is _DKDV_CONFIGS else (32, 16)
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in table]


def _bench(fn, quantiles):
    """Autotuner timer: triton's benchmarker with 100 ms of warm-up (the clock leaves idle first)."""
    return triton.runtime.driver.active.get_benchmarker()(fn, warmup=100, rep=100, quantiles=quantiles)


@triton.jit
def _preprocess_kernel(O, DO, Delta, DQA, S, Hq,
                       stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                       HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, ZERO_DQA: tl.constexpr):
    """delta[b, h, i] = sum_d o[b, i, h, d] * do[b, i, h, d] (fp32). Grid (cdiv(S, BLOCK), B * Hq).
    ZERO_DQA: also zero the same rows of the float32 dq accumulator DQA ([B, Hq, S, D]), so the
    atomic mode needs no separate memset."""
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows[:, None] < S
    o = tl.load(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_os + cols[None, :], mask=ok, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + rows[:, None] * stride_ds + cols[None, :], mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + bh.to(tl.int64) * S + rows, delta, mask=rows < S)
    if ZERO_DQA:
        tl.store(DQA + (bh.to(tl.int64) * S + rows[:, None]) * HEAD_DIM + cols[None, :],
                 tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32), mask=ok)


@triton.jit
def _dkdv_step(dk, dv, k, v, q_tile, do_tile, lse_ptr, delta_ptr, qd_offs, offs_m, offs_n, qk_scale, S,
               dqa_tile, dqa_offs, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """One query tile against the resident key tile (transposed formulation: rows are keys).

    P^T = exp2(K Q^T * qk_scale - lse2), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
    dK += dS^T Q. CAUSAL: the tile crosses the diagonal (query m sees key n iff m >= n).
    BOUNDS: rows past S load as zero with lse = +inf, so their P is exactly 0.
    ATOMIC_DQ: also add this tile pair's dQ_m contribution dS K_n (unscaled, fp32) to the dq
    accumulator rows of the tile (``dqa_tile + dqa_offs``) with relaxed atomic adds.
    """
    if BOUNDS:
        row_ok = offs_m < S
        q = tl.load(q_tile + qd_offs, mask=row_ok[:, None], other=0.0)
        lse2 = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    else:
        q = tl.load(q_tile + qd_offs)
        lse2 = tl.load(lse_ptr + offs_m) * 1.4426950408889634
    qkT = tl.dot(k, tl.trans(q))                                   # [BLOCK_N, BLOCK_M], raw scores
    pT = tl.exp2(qkT * qk_scale - lse2[None, :])
    if CAUSAL:
        pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
    if BOUNDS:
        do = tl.load(do_tile + qd_offs, mask=row_ok[:, None], other=0.0)
        delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
    else:
        do = tl.load(do_tile + qd_offs)
        delta = tl.load(delta_ptr + offs_m)
    dv = tl.dot(pT.to(do.dtype), do, dv)
    dpT = tl.dot(v, tl.trans(do))
    dsT = pT * (dpT - delta[None, :])
    ds16 = dsT.to(q.dtype)
    dk = tl.dot(ds16, q, dk)
    if ATOMIC_DQ:
        dq_part = tl.dot(tl.trans(ds16), k)                          # [BLOCK_M, D]
        if BOUNDS:
            tl.atomic_add(dqa_tile + dqa_offs, dq_part, mask=(offs_m < S)[:, None], sem="relaxed")
        else:
            tl.atomic_add(dqa_tile + dqa_offs, dq_part, sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, Delta, DK, DV, DQA,
                 qk_scale, scale, S, Hkv,
                 stride_qb, stride_qs, stride_qh,
                 stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vs, stride_vh,
                 stride_dob, stride_dos, stride_doh,
                 stride_dkb, stride_dks, stride_dkh,
                 stride_dvb, stride_dvs, stride_dvh,
                 HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """One program = key tile n of one (b, KV head); accumulates dK_n, dV_n over the G query heads.
    ATOMIC_DQ: also adds every tile pair's dQ contribution to DQA ([B, Hq, S, D] fp32, zeroed by
    the pre-pass) with atomics; otherwise DQA is unused and the dQ kernel computes dq.

    1-D grid of cdiv(S, BLOCK_N) * B * Hkv programs, key tile slowest and ascending (tile 0 has
    the most query tiles: longest first). EVEN: S % BLOCK_N == 0 (then also S % BLOCK_M == 0),
    no bounds checks anywhere.
    """
    Hq = Hkv * GROUP
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(S, BLOCK_N)
    n_units = tl.num_programs(0) // n_tiles                        # B * Hkv
    tile = pid // n_units
    unit = pid % n_units
    b = (unit // Hkv).to(tl.int64)
    kvh = (unit % Hkv).to(tl.int64)
    start_n = tile * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_mb = tl.arange(0, BLOCK_M)

    k_ptrs = K + b * stride_kb + kvh * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = V + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :]
    if EVEN:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_n[:, None] < S, other=0.0)
        v = tl.load(v_ptrs, mask=offs_n[:, None] < S, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Loop-invariant int32 offsets of a [BLOCK_M, D] tile of Q / dO (their strides are equal:
    # the caller checks); the tile base is a scalar pointer advanced per step.
    qd_offs = offs_mb[:, None] * stride_qs + offs_d[None, :]
    dqa_offs = offs_mb[:, None] * HEAD_DIM + offs_d[None, :]
    band_end = tl.minimum(start_n + BLOCK_N, S)
    for g in range(GROUP):
        h = kvh * GROUP + g
        q_head = Q + b * stride_qb + h * stride_qh
        do_head = DO + b * stride_dob + h * stride_doh
        lse_ptr = LSE + (b * Hq + h) * S
        delta_ptr = Delta + (b * Hq + h) * S
        dqa_head = DQA + (b * Hq + h) * S * HEAD_DIM
        # The band: query tiles overlapping the key tile (causal select).
        for start_m in range(start_n, band_end, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_head + start_m * stride_qs, do_head + start_m * stride_dos,
                                lse_ptr, delta_ptr, qd_offs, start_m + offs_mb, offs_n, qk_scale, S,
                                dqa_head + start_m * HEAD_DIM, dqa_offs, True, not EVEN, ATOMIC_DQ)
        # Every later query tile sees all keys of the tile: no select.
        for start_m in range(start_n + BLOCK_N, S, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_head + start_m * stride_qs, do_head + start_m * stride_dos,
                                lse_ptr, delta_ptr, qd_offs, start_m + offs_mb, offs_n, qk_scale, S,
                                dqa_head + start_m * HEAD_DIM, dqa_offs, False, not EVEN, ATOMIC_DQ)

    dk = dk * scale
    out_ok = offs_n[:, None] < S
    tl.store(DK + b * stride_dkb + kvh * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=out_ok)
    tl.store(DV + b * stride_dvb + kvh * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=out_ok)


#: The recompute mode's dK/dV kernel, autotuned (kernel argument ATOMIC_DQ = False). The atomic mode launches
#: ``_dkdv_kernel`` directly with a fixed tile: autotuning would benchmark it several times into
#: the same accumulator.
_dkdv_tuned = triton.autotune(configs=_configs(_DKDV_CONFIGS), key=["S", "HEAD_DIM", "GROUP"], do_bench=_bench)(
    triton.heuristics({"EVEN": lambda a: a["S"] % a["BLOCK_N"] == 0})(_dkdv_kernel))


@triton.jit
def _dq_convert_kernel(DQA, DQ, scale, S, Hq, stride_b, stride_s, stride_h,
                       HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """dq[b, i, h, :] = scale * dqa[b, h, i, :] in dq's dtype (atomic mode). Grid (cdiv(S, BLOCK), B * Hq)."""
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows[:, None] < S
    acc = tl.load(DQA + (bh.to(tl.int64) * S + rows[:, None]) * HEAD_DIM + cols[None, :], mask=ok, other=0.0)
    tl.store(DQ + b * stride_b + h * stride_h + rows[:, None] * stride_s + cols[None, :],
             (acc * scale).to(DQ.dtype.element_ty), mask=ok)


@triton.jit
def _dq_step(dq, q, do, lse2, delta, k_tile, v_tile, kv_offs, offs_m, offs_n, qk_scale, S,
             CAUSAL: tl.constexpr, BOUNDS: tl.constexpr):
    """One key tile against the resident query tile: P = exp2(Q K^T * qk_scale - lse2),
    dP = dO V^T, dS = P (dP - delta), dQ += dS K. CAUSAL: band tile (query m sees key n iff
    m >= n, which also hides keys >= S from every real row); BOUNDS: keys >= S load as zero."""
    if BOUNDS:
        k = tl.load(k_tile + kv_offs, mask=offs_n[:, None] < S, other=0.0)
    else:
        k = tl.load(k_tile + kv_offs)
    qk = tl.dot(q, tl.trans(k))
    p = tl.exp2(qk * qk_scale - lse2[:, None])
    if CAUSAL:
        p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    if BOUNDS:
        v = tl.load(v_tile + kv_offs, mask=offs_n[:, None] < S, other=0.0)
    else:
        v = tl.load(v_tile + kv_offs)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.autotune(configs=_configs(_DQ_CONFIGS), key=["S", "HEAD_DIM", "GROUP"], do_bench=_bench)
@triton.heuristics({"EVEN": lambda a: a["S"] % a["BLOCK_M"] == 0})
@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, Delta, DQ,
               qk_scale, scale, S, Hkv,
               stride_qb, stride_qs, stride_qh,
               stride_kb, stride_ks, stride_kh,
               stride_dob, stride_dos, stride_doh,
               stride_dqb, stride_dqs, stride_dqh,
               HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    """One program = query tile m of one (b, query head). 1-D grid of cdiv(S, BLOCK_M) * B * Hq
    programs, query tile slowest and descending (the last tile has the most key tiles), the
    heads of a KV group adjacent. K and V share strides (the caller checks)."""
    Hq = Hkv * GROUP
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(S, BLOCK_M)
    n_units = tl.num_programs(0) // n_tiles                        # B * Hq
    tile = n_tiles - 1 - pid // n_units
    bh = pid % n_units
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    kvh = h // GROUP
    start_m = tile * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_nb = tl.arange(0, BLOCK_N)
    row_ok = offs_m < S

    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + bh.to(tl.int64) * S + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
    delta = tl.load(Delta + bh.to(tl.int64) * S + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    kv_offs = offs_nb[:, None] * stride_ks + offs_d[None, :]
    k_tile = K + b * stride_kb + kvh * stride_kh
    v_tile = V + b * stride_kb + kvh * stride_kh                  # V has K's strides (contiguous, same shape)
    # Key tiles entirely before the query tile (keys < start_m <= S): no select, no bounds.
    for start_n in range(0, start_m, BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, k_tile, v_tile, kv_offs, offs_m, start_n + offs_nb, qk_scale, S,
                      False, False)
        k_tile += BLOCK_N * stride_ks
        v_tile += BLOCK_N * stride_ks
    # The band [start_m, min(start_m + BLOCK_M, S)): causal select.
    for start_n in range(start_m, tl.minimum(start_m + BLOCK_M, S), BLOCK_N):
        dq = _dq_step(dq, q, do, lse2, delta, k_tile, v_tile, kv_offs, offs_m, start_n + offs_nb, qk_scale, S,
                      True, not EVEN)
        k_tile += BLOCK_N * stride_ks
        v_tile += BLOCK_N * stride_ks

    dq = dq * scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal GQA attention backward.

    Args:
        q, o, do: ``[B, S, Hq, D]`` bf16/fp16, contiguous.
        k, v: ``[B, S, Hkv, D]``, q's dtype, contiguous; ``Hq % Hkv == 0``.
        lse: ``[B, Hq, S]`` float32 (natural log), contiguous.
        scale: softmax scale.

    Returns:
        ``(dq [B, S, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, D])`` in q's dtype.

    Raises:
        ValueError: inconsistent shapes, a head dim that is not a power of two in [16, 256], or
            non-contiguous inputs.
    """
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    if Hq % Hkv or k.shape != (B, S, Hkv, D) or v.shape != k.shape or o.shape != q.shape or do.shape != q.shape \
            or lse.shape != (B, Hq, S):
        raise ValueError(f"bad shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} o {tuple(o.shape)} "
                         f"do {tuple(do.shape)} lse {tuple(lse.shape)}")
    if D not in (16, 32, 64, 128, 256) or not all(t.is_contiguous() for t in (q, k, v, o, do, lse)):
        raise ValueError("head dim must be a power of two in [16, 256]; inputs must be contiguous")
    G = Hq // Hkv
    atomic = _atomic_dq(S, D, G)
    delta = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    dqa = torch.empty((B, Hq, S, D), device=q.device, dtype=torch.float32) if atomic else delta
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    pre_block = 32 if _INTERPRET else 128
    _preprocess_kernel[(triton.cdiv(S, pre_block), B * Hq)](
        o, do, delta, dqa, S, Hq, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2),
        HEAD_DIM=D, BLOCK=pre_block, ZERO_DQA=atomic, num_warps=4)
    qk_scale = scale * LOG2E
    args = (q, k, v, do, lse, delta, dk, dv, dqa, qk_scale, scale, S, Hkv,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2))
    if atomic:
        bm, bn, warps, stages = (16, 32, 1, 1) if _INTERPRET else _ATOMIC_DKDV_CONFIG
        _dkdv_kernel[(triton.cdiv(S, bn) * B * Hkv,)](
            *args, HEAD_DIM=D, GROUP=G, BLOCK_M=bm, BLOCK_N=bn, EVEN=S % bn == 0, ATOMIC_DQ=True,
            num_warps=warps, num_stages=stages)
        _dq_convert_kernel[(triton.cdiv(S, pre_block), B * Hq)](
            dqa, dq, scale, S, Hq, dq.stride(0), dq.stride(1), dq.stride(2), HEAD_DIM=D, BLOCK=pre_block, num_warps=4)
        return dq, dk, dv
    _dkdv_tuned[lambda meta: (triton.cdiv(S, meta["BLOCK_N"]) * B * Hkv,)](*args, HEAD_DIM=D, GROUP=G, ATOMIC_DQ=False)
    _dq_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_M"]) * B * Hq,)](
        q, k, v, do, lse, delta, dq, qk_scale, scale, S, Hkv,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        HEAD_DIM=D, GROUP=G)
    return dq, dk, dv
