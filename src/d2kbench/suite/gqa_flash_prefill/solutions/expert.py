"""Expert Triton solution: causal GQA FlashAttention forward (FA2-style, Hopper-tuned).

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k, v, scale)`` with ``q: [B, S, Hq, D]``, ``k, v: [B, S, Hkv, D]`` (bf16; fp16 on the CPU
smoke workloads; contiguous BSHD, ``Hq % Hkv == 0``) returns ``(o, lse)``: ``o`` ``[B, S, Hq, D]``
in q's dtype and ``lse`` ``[B, Hq, S]`` float32 (natural log of each row's softmax denominator).

Design
------
L1 -- online softmax, causal tile skipping, scale folding.
    One program owns a ``BLOCK_M`` tile of query rows of one head and streams the K/V tiles of
    its KV head once. A running row max ``m`` and row sum ``l`` (fp32) rescale the partial
    output when the max grows, so the ``S x S`` scores never exist in memory. K/V tiles after
    the tile's last row are never visited (half of the FLOPs and exps). ``scale * log2(e)`` is
    folded into one multiply of the scores, and every exponential is an ``exp2``; the LSE is
    ``(m + log2(l)) * ln(2)``.

L2 -- dataflow.
    The Q tile is loaded once and stays on chip; ``m``, ``l`` and the ``BLOCK_M x D`` fp32
    accumulator live in registers for the whole sweep. Scores and probabilities are produced in
    registers and P is cast to the input dtype straight into the second MMA. The KV loop is split
    in two phases: the tiles entirely below the diagonal (no mask code, no bounds checks) and the
    one or two diagonal tiles (causal mask). The output is normalised once in the epilogue.
    Nothing but ``o`` and ``lse`` is written.

    Program order (1-D grid): the query-tile index is the slowest coordinate and runs from the
    last (longest causal row range) to the first: longest-processing-time first, so the short
    tiles fill the tail of the schedule. Within a tile index, the head index is the fastest
    coordinate, so the ``G = Hq / Hkv`` programs of one KV group (same b, same tile) are
    adjacent and read the same K/V tiles at the same time: one HBM read per group, the others
    hit L2.

L3 -- Hopper mapping.
    ``BLOCK_M = 128`` rows with 8 warps (two warpgroups of 64 rows, the wgmma M granularity) for
    D <= 128; smaller N tiles and 2 stages for D = 256 to stay in registers and shared memory.
    ``tl.dot`` with fp32 accumulation lowers to wgmma; the K/V loads are software-pipelined (kernel
    ``num_stages = 2``, deeper buffering only through ``tl.range(num_stages=LOOP_STAGES)`` on the
    unmasked loop: kernel-wide ``num_stages >= 3`` makes ptxas serialise every wgmma). Scalar base offsets are int64 (``b * stride_b`` exceeds 2^31 bytes on large
    batches); the K/V loops advance one *scalar* tile pointer per iteration and add loop-invariant
    int32 offset tensors (a loop-carried BLOCK_N x D tensor of 64-bit pointers costs two registers
    per element and spilled every config). A short autotune list per head dim picks the tile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634


def _configs() -> list[triton.Config]:
    """Autotune candidates (BLOCK_M a multiple of BLOCK_N: the unmasked phase ends on a tile edge).

    Five at D <= 128, four at D = 256 (:func:`_prune` keeps the head dim's list): the first call
    autotunes every kept config once per (S, HEAD_DIM, GROUP) key, so the lists stay short. Every
    config fits the H200's 227 KB of shared memory, compiles without register spills (checked for
    sm_90 with devtools/compile_sm90.py and the cubins' STACK size) and without serialised wgmma
    (``ptxas -v`` warning C7515, see ``LOOP_STAGES`` in the kernel).
    """
    if _INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "LOOP_STAGES": 0}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "LOOP_STAGES": ls}, num_warps=w, num_stages=2)
            for bm, bn, w, ls in sorted(_D128_CONFIGS | _D256_CONFIGS, reverse=True)]


#: (BLOCK_M, BLOCK_N, num_warps, LOOP_STAGES) per head dim. The kernel is always compiled with
#: num_stages=2; LOOP_STAGES > 0 deepens only the K/V pipeline of the unmasked loop (0: the
#: default 2 buffers). Kernel-wide num_stages >= 3 made ptxas serialise every wgmma of the kernel
#: (C7515: "non wgmma instructions defining accumulator registers ..." -- a wait after each
#: HGMMA, 24-48 WARPGROUP.DEPBAR instead of 4), which the previous list shipped in 5 of its 8
#: configs; the loop-level stage count keeps the same buffering with wgmma pipelined.
#: sm_90 shared memory and registers per thread (ptxas) in the comments, all without spills.
#: At D = 256 all use 8 warps: with 4 warps the fp32 accumulator alone is 128 registers per
#: thread (64 x 64 and 64 x 32 tiles with 4 warps spilled).
_D128_CONFIGS = {(128, 128, 8, 0),   # 160 KB, 244 regs
                 (128, 128, 8, 3),   # 224 KB, 255 regs
                 (128, 64, 8, 3),    # 128 KB, 185 regs
                 (128, 64, 8, 4),    # 160 KB, 185 regs
                 (64, 64, 4, 3)}     # 112 KB, 199 regs: two CTAs per SM (2 x 113 KB, 2 x 25.6K regs)
_D256_CONFIGS = {(128, 64, 8, 0),    # 192 KB, 255 regs
                 (128, 32, 8, 3),    # 160 KB, 246 regs
                 (64, 64, 8, 0),     # 160 KB, 201 regs
                 (64, 32, 8, 3)}     # 128 KB, 157 regs


def _prune(configs, named_args, **kwargs):
    """Keep the candidates meant for the head dim (large N tiles spill registers at D = 256)."""
    if _INTERPRET:
        return configs
    d = named_args.get("HEAD_DIM", kwargs.get("HEAD_DIM"))
    want = _D256_CONFIGS if d is not None and d > 128 else _D128_CONFIGS
    kept = [c for c in configs
            if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.kwargs["LOOP_STAGES"]) in want]
    return kept or configs


@triton.autotune(configs=_configs(), key=["S", "HEAD_DIM", "GROUP"], prune_configs_by={"early_config_prune": _prune})
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
):
    """One program = one BLOCK_M tile of query rows of one (b, h). 1-D grid, LPT tile order.

    Q/K/V/O are BSHD with unit stride on D; LSE is [B, Hq, S] contiguous fp32.
    """
    Hq = Hkv * GROUP
    pid = tl.program_id(0)
    n_heads = tl.num_programs(0) // tl.cdiv(S, BLOCK_M)   # B * Hq
    tile = tl.cdiv(S, BLOCK_M) - 1 - pid // n_heads      # longest causal tiles first
    bh = pid % n_heads                                   # b * Hq + h: heads of one KV group adjacent
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    kvh = h // GROUP
    start_m = tile * BLOCK_M

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q_base = Q + b * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = V + b * stride_vb + kvh.to(tl.int64) * stride_vh

    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=offs_m[:, None] < S, other=0.0)

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
    k_tile = k_base
    v_tile = v_base

    # Phase 1: KV tiles entirely below the diagonal (keys < start_m <= S): no mask, no bounds.
    # LOOP_STAGES > 0: K/V buffers of this loop's software pipeline (the kernel's num_stages stays 2).
    for start_n in tl.range(0, start_m, BLOCK_N, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        k = tl.load(k_tile + k_offs)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_tile + v_offs)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        k_tile += BLOCK_N * stride_ks
        v_tile += BLOCK_N * stride_vs

    # Phase 2: the diagonal tiles [start_m, min(start_m + BLOCK_M, S)): causal mask (it also hides
    # keys >= S from every valid row); loads past S are masked to zero.
    for start_n in range(start_m, tl.minimum(start_m + BLOCK_M, S), BLOCK_N):
        kn = start_n + offs_n
        k = tl.load(k_tile + k_offs, mask=kn[:, None] < S, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        qk = tl.where(offs_m[:, None] >= kn[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_tile + v_offs, mask=kn[:, None] < S, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        k_tile += BLOCK_N * stride_ks
        v_tile += BLOCK_N * stride_vs

    # Epilogue: normalise once; lse in natural log.
    out = acc / l_i[:, None]
    o_base = O + b * stride_ob + h.to(tl.int64) * stride_oh
    row_ok = offs_m < S
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # ln(2): log2 -> natural log
    tl.store(LSE + bh.to(tl.int64) * S + offs_m, lse, mask=row_ok)


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
