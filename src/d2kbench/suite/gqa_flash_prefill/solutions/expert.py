"""Expert Triton solution: causal GQA FlashAttention forward (FA2-style, Hopper-tuned).

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k, v, scale)`` with ``q: [B, S, Hq, D]``, ``k, v: [B, S, Hkv, D]`` (bf16; fp16 on the CPU
smoke workloads; contiguous BSHD, ``Hq % Hkv == 0``) returns ``(o, lse)``: ``o`` ``[B, S, Hq, D]``
in q's dtype and ``lse`` ``[B, Hq, S]`` float32 (natural log of each row's softmax denominator).

Design
------
L1 -- online softmax, causal tile skipping, scale folding.
    One program owns ``BLOCK_M`` query rows that share one KV head and streams that head's K/V
    tiles once. A running row max ``m`` and row sum ``l`` (fp32) rescale the partial output when
    the max grows, so the ``S x S`` scores never exist in memory. K/V tiles after the program's
    last query position are never visited (half of the FLOPs and exps). ``scale * log2(e)`` is
    folded into the exponent: the row max is taken on the raw scores and scaled once per row, and
    ``qk * scale' - m`` is one FFMA per score; every exponential is an ``exp2``; the LSE is
    ``(m + log2(l)) * ln(2)``.

L2 -- dataflow.
    The Q tile is loaded once and stays on chip; ``m``, ``l`` and the ``BLOCK_M x D`` fp32
    accumulator live in registers for the whole sweep. Scores and probabilities are produced in
    registers and P is cast to the input dtype straight into the second MMA. The output is
    normalised once in the epilogue (one reciprocal per row). Nothing but ``o`` and ``lse`` is
    written.

    GQA packing (``PACK``, D = 128): the rows of a program are ``BLOCK_M / G`` consecutive
    positions of all ``G = Hq / Hkv`` query heads of one KV head (in BSHD those heads are adjacent,
    so Q and O rows stay contiguous runs), so every K/V tile brought on chip serves the whole
    group (a quarter to an eighth of the K/V traffic from L2 of one-head tiles) and the diagonal
    band is ``BLOCK_M / G`` positions deep instead of ``BLOCK_M`` (less masked work). Without
    packing (D = 256) one program is ``BLOCK_M`` positions of one head.

    Key loop: either one software-pipelined loop over every tile with the causal mask behind a
    branch taken on the band tiles only (``ONE_LOOP``: the band tiles are prefetched like the
    others, no pipeline drain before them), or an unmasked loop over the tiles below the band
    followed by a masked loop over the band. K is loaded at the top of an iteration and V after
    the exponentials (one wait each). Key bounds checks exist only when ``S % BLOCK_N != 0``.

    Program order (1-D grid): the query-tile index is the slowest coordinate and runs from the
    last (longest causal range) to the first: longest-processing-time first, so the short tiles
    fill the tail of the schedule. Within a tile index the (b, head) or (b, KV head) index is the
    fastest coordinate (unpacked: the G programs of one KV group are adjacent and read the same
    K/V tiles at the same time, one HBM read per group, the others hit L2).

L3 -- Hopper mapping.
    ``BLOCK_M = 256`` rows with 16 warps or 128 rows with 8 warps (warpgroups of 64 rows, the wgmma
    M granularity; at D = 128 with GQA packing, 256 rows are 64 positions of a 4-head group, and
    each K/V tile brought on chip feeds twice the MMA work of a 128-row tile).
    ``tl.dot`` with fp32 accumulation lowers to wgmma; the K/V loads are software-pipelined (kernel
    ``num_stages = 2``, deeper buffering only through ``tl.range(num_stages=LOOP_STAGES)`` on the
    key loop: kernel-wide ``num_stages >= 3`` makes ptxas serialise every wgmma). Scalar base
    offsets are int64 (``b * stride_b`` exceeds 2^31 bytes on large batches); the K/V loops
    advance one *scalar* tile pointer per iteration and add loop-invariant int32 offset tensors
    (a loop-carried BLOCK_N x D tensor of 64-bit pointers costs two registers per element and
    spilled every config). A two-entry autotune list (D = 128) picks the tile per (S, D, G).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634


def _configs() -> list[triton.Config]:
    """Autotune candidates (BLOCK_M a multiple of BLOCK_N: the off-band loop ends on a tile edge).

    :func:`_prune` keeps the head dim's list: the first call autotunes every kept config once per
    (S, HEAD_DIM, GROUP) key, so the lists stay short. Every config fits the H200's 227 KB of
    shared memory and compiles without serialised wgmma (``ptxas -v`` warning C7515, see
    ``LOOP_STAGES`` in the kernel); register spills: see the lists (checked for sm_90 with
    devtools/compile_sm90.py and the cubins' STACK size).
    """
    if _INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "LOOP_STAGES": 0, "PACK": _INTERP_SWITCHES[0],
                               "ONE_LOOP": _INTERP_SWITCHES[1]}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "LOOP_STAGES": ls, "PACK": pk, "ONE_LOOP": ol},
                          num_warps=w, num_stages=2)
            for bm, bn, w, ls, pack, ol in sorted(_D128_CONFIGS | _D256_CONFIGS, reverse=True)
            for pk in sorted({pack, 0})]   # the non-packed twin of a PACK config: for GROUP > BLOCK_M


#: (BLOCK_M, BLOCK_N, num_warps, LOOP_STAGES, PACK, ONE_LOOP) per head dim. The kernel is always
#: compiled with num_stages=2; LOOP_STAGES > 0 deepens only the K/V pipeline of the key loop
#: (0: the default 2 buffers). Kernel-wide num_stages >= 3 made ptxas serialise every wgmma of the
#: kernel (C7515: "non wgmma instructions defining accumulator registers ..." -- a wait after each
#: HGMMA, 24-48 WARPGROUP.DEPBAR instead of 4); the loop-level stage count keeps the buffering with
#: wgmma pipelined. PACK and ONE_LOOP: see the kernel.
#: Chosen from a sweep of 5 tiles x {packed, unpacked} x {one loop, two loops} on the H200, then
#: d2k bench with each candidate alone (mean ms, s2048 / s8192 / s32768 workloads):
#: (128, 64, 8, 3, 1, 1) 0.707 / 4.772 / 4.449; (128, 128, 8, 3, 1, 0) 0.747 / 4.678 / 4.336;
#: (64, 64, 4, 3, 0, 0), two CTAs per SM, 0.734 / 5.085 / 4.541 (dropped: never the best).
#: Then (256, 64, 16, 3, 1, 1) alone against that two-entry list, interleaved in one d2k bench
#: (results/h200/tuning/prefill_m256.md): 0.656 / 4.611 / 4.361 vs 0.697 / 4.680 / 4.350, so it
#: replaced (128, 64, ...). (A lazy-rescaling variant -- rescale only when a row max grows by
#: more than 8 in log2 units -- was slower, 0.761 / 5.067 / 4.633, and less accurate: dropped.)
#: sm_90 (ptxas): (256, 64, ...) 160 KB shared memory, 128 registers (the cap at 512 threads),
#: 24 B of stack; (128, 128, ...) 224 KB, 255 registers, no spills except 24 B of stack at
#: Hkv = 1 (the int argument specialised to 1; llama31_70b_tp8, where it is still as fast).
_D128_CONFIGS = {(256, 64, 16, 3, 1, 1), (128, 128, 8, 3, 1, 0)}
#: D = 256: 192 KB, 255 registers, no spills on the registered shapes (16 B of stack when
#: S % 64 != 0, the correctness-only ragged workload). d2k bench on qwen3_next_80b_s16384:
#: 3.90 ms; packed twin 3.93; two loops unpacked 4.19; (128, 32, 8, 3, 1, 1) 4.63.
_D256_CONFIGS = {(128, 64, 8, 0, 0, 1)}
#: (PACK, ONE_LOOP) of the single CPU-interpreter config: the path of the s2048 workload (the
#: other three combinations pass the smoke workloads too when this is edited).
_INTERP_SWITCHES = (1, 1)


def _prune(configs, named_args, **kwargs):
    """Keep the candidates meant for the head dim (large N tiles spill registers at D = 256);
    PACK needs at least one position per program (BLOCK_M >= GROUP), else the non-packed twin."""
    if _INTERPRET:
        return configs
    d = named_args.get("HEAD_DIM", kwargs.get("HEAD_DIM"))
    g = named_args.get("GROUP", kwargs.get("GROUP")) or 1
    want = _D256_CONFIGS if d is not None and d > 128 else _D128_CONFIGS
    want = {(bm, bn, w, ls, pk if bm >= g else 0, ol) for bm, bn, w, ls, pk, ol in want}
    kept = [c for c in configs
            if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.kwargs["LOOP_STAGES"],
                c.kwargs["PACK"], c.kwargs["ONE_LOOP"]) in want]
    return kept or configs


@triton.jit
def _online_step(qk, acc, m_i, l_i, qk_scale, v_ptrs, kn, S, MASK_KEYS: tl.constexpr):
    """One online-softmax step on a tile of raw (unscaled) scores ``qk``; returns acc, m, l.

    The row max is kept in scaled log2 units; ``qk * qk_scale - m`` is one FFMA per score (the
    max commutes with the positive scale, so it is taken on the raw scores and scaled once per
    row). Masked scores are -inf and give p = 0. The V tile is loaded here, after the
    exponentials, not next to the K tile: the pipelined loop then waits for K before QK^T and
    for V only before PV (loading both at the top of the iteration made the loop wait for V
    before QK^T: one wait instead of two in the SASS; d2k bench on the H200, qwen3_next_80b
    (D = 256, 2 stages): 4.14 -> 3.90 ms).
    MASK_KEYS: keys >= S load as zeros (their scores are already -inf).
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASK_KEYS:
        v = tl.load(v_ptrs, mask=kn[:, None] < S, other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


def _bench(fn, quantiles):
    """Autotuner timer: the driver's benchmarker (triton's ``do_bench``) with 100 ms of warm-up
    instead of 25, so that the GPU clock has left idle before the first candidate is timed. With
    it, in d2k bench on the H200 the tuned expert came within 1% of the best candidate run alone
    on every workload."""
    return triton.runtime.driver.active.get_benchmarker()(fn, warmup=100, rep=100, quantiles=quantiles)


@triton.autotune(configs=_configs(), key=["S", "HEAD_DIM", "GROUP"], prune_configs_by={"early_config_prune": _prune},
                 do_bench=_bench)
@triton.heuristics({"EVEN_N": lambda a: a["S"] % a["BLOCK_N"] == 0})
@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,
    qk_scale,                      # scale * log2(e), fp32
    S, Hkv,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
    PACK: tl.constexpr, ONE_LOOP: tl.constexpr, EVEN_N: tl.constexpr,
):
    """One program = BLOCK_M query rows against the K/V of one (b, KV head). 1-D grid, LPT order.

    PACK = 0: the rows are BLOCK_M consecutive positions of one query head. PACK = 1: they are
    P = BLOCK_M // GROUP consecutive positions of all GROUP query heads of the KV head (row r is
    position start + r // GROUP of head kvh * GROUP + r % GROUP: in BSHD the GROUP rows of one
    position are one contiguous run of GROUP * D elements), and every K/V tile fetched serves
    the whole group. ONE_LOOP = 0: an unmasked loop over the off-band key tiles, then a masked
    loop over the band; ONE_LOOP = 1: one software-pipelined loop over all tiles whose causal mask
    sits behind a branch taken only on the band tiles (their loads are prefetched with the rest).
    EVEN_N (S % BLOCK_N == 0, set by the heuristic): no key bounds checks at all.
    Q/K/V/O are BSHD with unit stride on D; LSE is [B, Hq, S] contiguous fp32.
    """
    Hq = Hkv * GROUP
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK_M)
    if PACK:
        P: tl.constexpr = BLOCK_M // GROUP                  # positions per program
        n_tiles = tl.cdiv(S, P)
        n_units = tl.num_programs(0) // n_tiles             # B * Hkv
        tile = n_tiles - 1 - pid // n_units                # longest causal tiles first
        unit = pid % n_units                                # b * Hkv + kvh
        b = (unit // Hkv).to(tl.int64)
        kvh = unit % Hkv
        start_m = tile * P
        end_m = tl.minimum(start_m + P, S)
        pos = start_m + r // GROUP                          # query position of each row
        head = kvh * GROUP + r % GROUP                      # query head of each row
        row_ok = (r < P * GROUP) & (pos < S)                # P * GROUP < BLOCK_M if GROUP is not a power of 2
        q_ptrs = Q + b * stride_qb + pos[:, None] * stride_qs + head[:, None] * stride_qh
        o_ptrs = O + b * stride_ob + pos[:, None] * stride_os + head[:, None] * stride_oh
        lse_ptrs = LSE + (b * Hq + head) * S + pos
    else:
        n_tiles = tl.cdiv(S, BLOCK_M)
        n_units = tl.num_programs(0) // n_tiles             # B * Hq
        tile = n_tiles - 1 - pid // n_units                 # longest causal tiles first
        bh = pid % n_units                                  # b * Hq + h: heads of one KV group adjacent
        b = (bh // Hq).to(tl.int64)
        h = bh % Hq
        kvh = h // GROUP
        start_m = tile * BLOCK_M
        end_m = tl.minimum(start_m + BLOCK_M, S)
        pos = start_m + r
        row_ok = pos < S
        q_ptrs = Q + b * stride_qb + h.to(tl.int64) * stride_qh + pos[:, None] * stride_qs
        o_ptrs = O + b * stride_ob + h.to(tl.int64) * stride_oh + pos[:, None] * stride_os
        lse_ptrs = LSE + bh.to(tl.int64) * S + pos
    # First key of the diagonal band (a BLOCK_N edge): every key before it precedes every row.
    band_n = (start_m // BLOCK_N) * BLOCK_N

    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # K/V addressing: a *scalar* pointer to the current tile (int64 base, advanced by one tile per
    # iteration) plus loop-invariant int32 offset tensors. Never carry BLOCK_N x D tensors of
    # 64-bit pointers through the loop: that costs 2 registers per element per operand (and more
    # copies for the software pipeline) and spilled every config to local memory (255 registers,
    # 0.5-2.4 KB of stack), 3-4.6x slower than recomputing the addresses.
    k_offs = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vs + offs_d[None, :]
    k_tile = K + b * stride_kb + kvh.to(tl.int64) * stride_kh
    v_tile = V + b * stride_vb + kvh.to(tl.int64) * stride_vh

    if ONE_LOOP:
        # All tiles [0, end_m) in one pipelined loop; LOOP_STAGES > 0: its K/V buffers.
        for start_n in tl.range(0, end_m, BLOCK_N, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
            kn = start_n + offs_n
            if EVEN_N:
                k = tl.load(k_tile + k_offs)
            else:
                k = tl.load(k_tile + k_offs, mask=kn[:, None] < S, other=0.0)
            qk = tl.dot(q, tl.trans(k))
            if start_n >= band_n:   # band tile: causal mask (it also hides keys >= S)
                qk = tl.where(pos[:, None] >= kn[None, :], qk, float("-inf"))
            acc, m_i, l_i = _online_step(qk, acc, m_i, l_i, qk_scale, v_tile + v_offs, kn, S, not EVEN_N)
            k_tile += BLOCK_N * stride_ks
            v_tile += BLOCK_N * stride_vs
    else:
        # Phase 1: key tiles entirely below the band (keys < band_n <= S): no mask, no bounds.
        for start_n in tl.range(0, band_n, BLOCK_N, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
            k = tl.load(k_tile + k_offs)
            qk = tl.dot(q, tl.trans(k))
            acc, m_i, l_i = _online_step(qk, acc, m_i, l_i, qk_scale, v_tile + v_offs, offs_n, S, False)
            k_tile += BLOCK_N * stride_ks
            v_tile += BLOCK_N * stride_vs
        # Phase 2: the band [band_n, end_m): causal mask (it also hides keys >= S from every valid
        # row); loads past S are masked to zero unless EVEN_N.
        for start_n in range(band_n, end_m, BLOCK_N):
            kn = start_n + offs_n
            if EVEN_N:
                k = tl.load(k_tile + k_offs)
            else:
                k = tl.load(k_tile + k_offs, mask=kn[:, None] < S, other=0.0)
            qk = tl.dot(q, tl.trans(k))
            qk = tl.where(pos[:, None] >= kn[None, :], qk, float("-inf"))
            acc, m_i, l_i = _online_step(qk, acc, m_i, l_i, qk_scale, v_tile + v_offs, kn, S, not EVEN_N)
            k_tile += BLOCK_N * stride_ks
            v_tile += BLOCK_N * stride_vs

    # Epilogue: normalise once (one reciprocal per row); lse in natural log.
    out = acc * (1.0 / l_i)[:, None]
    tl.store(o_ptrs + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # ln(2): log2 -> natural log
    tl.store(lse_ptrs, lse, mask=row_ok)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention forward.

    Args:
        q: ``[B, S, Hq, D]`` bf16/fp16, unit stride on D.
        k, v: ``[B, S, Hkv, D]``, q's dtype, unit stride on D; ``Hq % Hkv == 0``.
        scale: softmax scale.

    Returns:
        ``o [B, S, Hq, D]`` (q's dtype) and ``lse [B, Hq, S]`` float32 (natural log).
    """
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    if Hq % Hkv or k.shape != (B, S, Hkv, D) or v.shape != k.shape:
        raise ValueError(f"bad shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)}")
    if D not in (16, 32, 64, 128, 256) or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("head dim must be a power of two in [16, 256] with unit stride")
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)

    def grid(meta):
        if meta["PACK"]:
            return (triton.cdiv(S, meta["BLOCK_M"] // (Hq // Hkv)) * B * Hkv,)
        return (triton.cdiv(S, meta["BLOCK_M"]) * B * Hq,)

    _attn_fwd_kernel[grid](
        q, k, v, o, lse, scale * LOG2E, S, Hkv,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        HEAD_DIM=D, GROUP=Hq // Hkv,
    )
    return o, lse
