"""Expert Triton solution: sliding-window causal GQA attention with sinks and logit soft-capping.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k, v, sinks, scale, window, softcap)`` with ``q: [B, S, Hq, D]``, ``k, v: [B, S, Hkv, D]``
(bf16; fp16 on the CPU smoke workloads; contiguous BSHD), ``sinks: [Hq]`` float32 (``-inf``: no
sink), returns ``(o [B, S, Hq, D], lse [B, Hq, S] float32)`` (the LSE includes the sink).

Design
------
L1 -- band skipping, sinks in the softmax state.
    A query tile of positions ``[i0, i1)`` needs only the keys ``[i0 - W + 1, i1)``: the key loop
    starts at the tile holding the first row's first window key and stops at the diagonal, so
    the work is proportional to ``S * W``, not ``S^2 / 2`` (16x fewer MMAs on the Gemma-3
    workload, 64x on gpt-oss). Only the tiles at the window's left edge and on the diagonal
    evaluate a mask; the tiles between are fully visible. The running max starts from a finite
    floor (-1e30), which keeps rows whose first visited tiles lie entirely outside their window
    free of ``exp(-inf - (-inf))``. A sink logit ``s_h`` joins the denominator in the epilogue,
    once per row, merged like a second softmax state (``M = max(m, s_h)``, ``l e^(m - M) +
    e^(s_h - M)``): no extra pass or column, and the probabilities fed to the PV product stay
    relative to the row's largest score. (Starting the online softmax from ``m = s_h, l = 1``
    is equally exact, but when the sink dominates a row -- a window of one key, a row's first
    keys -- every probability is then a rounded fraction: up to 2^-8 of error in bf16 that no
    averaging over keys removes, which would use most of the tolerance.) Soft-capping turns each
    raw score into ``c tanh(scale x / c)`` in base-2 units before the mask, with ``tanh`` from one
    ``exp2`` and one division (exact to fp32 rounding; an approximate hardware tanh would be off
    by up to 2.5e-2 in a capped logit of 50).

L2 -- dataflow.
    The G query heads of one KV head are packed into the rows of a tile (``BLOCK_M / G``
    positions x G heads, contiguous in BSHD): every K/V tile of the band is fetched once for
    the whole group, and for the memory-bound gpt-oss workload (window 128, q and o 8x larger
    than k and v) q and o are streamed exactly once. Q resident; ``m``, ``l`` and the
    accumulator in registers; P cast straight into the second MMA; one normalisation; o and lse
    written once. Programs of one (batch, KV head) are adjacent and walk its query tiles, so
    neighbouring tiles' overlapping bands come from L2.

L3 -- Hopper mapping.
    A two-entry autotune list per head dim keyed on (S, W, D, G, softcap): at D = 128, 128-row
    packed tiles on 8 warps or 64 rows on 4 warps (64-key tiles, three K/V buffers in the key
    loop); at D = 64, 128 rows on 4 warps or 256 on 8 (the gpt-oss workload is memory-bound:
    the smaller tile leaves room for two programs per SM); at D = 256, 128 or 64 rows with
    32-key tiles (the accumulator doubles and the cap's tanh needs registers: 64-key tiles spill
    there). sm_90 (ptxas): 192-255 registers, 64-192 KB shared memory, no spills on any
    registered or adversarial shape (a 256-row, 16-warp tile at D = 128 spilled 8-32 B: dropped).
    One software-pipelined key loop whose mask sits behind a branch taken only on edge and
    diagonal tiles; loads past S predicated. int64 base offsets; scalar K/V tile pointers plus
    loop-invariant int32 offsets.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
#: Initial running max of a row without a sink (finite: exp2(-inf - NEG) = 0 and exp2(NEG - NEG) = 1).
NEG = -1.0e30

#: (BLOCK_M, BLOCK_N, num_warps, LOOP_STAGES) candidates per head-dim class; BLOCK_M rows are
#: BLOCK_M / G positions of the G heads of one KV head. Every entry compiles for sm_90 without
#: spills (devtools/compile_sm90.py): D = 128, the 128-row tile gqa_flash_prefill measured within
#: 2-8% of its best on the H200, and a 64-row one (two programs per SM); D = 64, 128 rows on 4
#: warps (memory-bound: occupancy) or 256 on 8; D = 256, 32-key tiles (64-key ones spill with the
#: soft-cap's extra registers).
_CONFIGS = {
    64: [(128, 64, 4, 3), (256, 64, 8, 3)],
    128: [(128, 64, 8, 3), (64, 64, 4, 3)],
    256: [(128, 32, 8, 0), (64, 32, 4, 0)],
}


def _configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "LOOP_STAGES": 0}, num_warps=1, num_stages=1)]
    seen = sorted({c for lst in _CONFIGS.values() for c in lst}, reverse=True)
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "LOOP_STAGES": ls}, num_warps=w, num_stages=2)
            for bm, bn, w, ls in seen]


def _prune(configs, named_args, **kwargs):
    """Keep the head-dim class's candidates whose tile holds at least one position of the group."""
    if _INTERPRET:
        return configs
    d = named_args.get("HEAD_DIM", kwargs.get("HEAD_DIM"))
    g = named_args.get("GROUP", kwargs.get("GROUP")) or 1
    want = set(_CONFIGS[64 if d <= 64 else 128 if d <= 128 else 256])
    kept = [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.kwargs["LOOP_STAGES"]) in want
            and c.kwargs["BLOCK_M"] >= g]
    if not kept:
        raise ValueError(f"GQA group of {g} query heads exceeds every tile of the head dim {d}")
    return kept


def _bench(fn, quantiles):
    """Autotuner timer with 100 ms of warm-up (the GPU clock leaves idle before the first candidate)."""
    return triton.runtime.driver.active.get_benchmarker()(fn, warmup=100, rep=100, quantiles=quantiles)


@triton.autotune(configs=_configs(), key=["S", "W", "HEAD_DIM", "GROUP", "SOFTCAP"],
                 prune_configs_by={"early_config_prune": _prune}, do_bench=_bench)
@triton.jit
def _swa_fwd_kernel(
    Q, K, V, O, LSE, SINKS,
    qk_scale,          # scale * log2(e): raw score -> base-2 logit (no soft-cap)
    cap_in,            # 2 * log2(e) * scale / softcap: raw score -> exponent of exp2 in tanh
    cap_out,           # softcap * log2(e): tanh -> base-2 logit
    S, W, Hkv,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """One program = ``P = BLOCK_M // GROUP`` positions x the GROUP query heads of one (b, KV head),
    against the keys of its band ``[start - W + 1, end)``. Programs of one (b, KV head) are
    consecutive, query tiles from the last to the first."""
    P: tl.constexpr = BLOCK_M // GROUP
    Hq = Hkv * GROUP
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(S, P)
    unit = pid // n_tiles
    tile = n_tiles - 1 - pid % n_tiles
    b = (unit // Hkv).to(tl.int64)
    kvh = unit % Hkv
    start_m = tile * P
    end_m = tl.minimum(start_m + P, S)

    r = tl.arange(0, BLOCK_M)
    pos = start_m + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < P * GROUP) & (pos < S)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + pos[:, None] * stride_qs + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)

    # running max from a finite floor (rows whose first tiles lie outside their window stay finite)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    lo = tl.maximum(start_m - W + 1, 0)
    lo = (lo // BLOCK_N) * BLOCK_N                 # first key tile of the band
    band_n = (start_m // BLOCK_N) * BLOCK_N        # tiles from here may cross the diagonal
    edge_n = end_m - W                             # tiles starting below this hold keys outside some row's window
    k_offs = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_offs = offs_n[:, None] * stride_vs + offs_d[None, :]
    k_tile = K + b * stride_kb + kvh.to(tl.int64) * stride_kh + lo.to(tl.int64) * stride_ks
    v_tile = V + b * stride_vb + kvh.to(tl.int64) * stride_vh + lo.to(tl.int64) * stride_vs
    for start_n in tl.range(lo, end_m, BLOCK_N, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        kn = start_n + offs_n
        k = tl.load(k_tile + k_offs, mask=kn[:, None] < S, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if SOFTCAP:       # c tanh(scale x / c) in base-2 units; tanh(y) = 1 - 2 / (exp(2y) + 1)
            s2 = cap_out * (1.0 - 2.0 / (tl.exp2(qk * cap_in) + 1.0))
        else:
            s2 = qk * qk_scale
        if (start_n >= band_n) | (start_n < edge_n):   # diagonal or left-edge tile
            visible = (pos[:, None] >= kn[None, :]) & (kn[None, :] > pos[:, None] - W)
            s2 = tl.where(visible, s2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        p = tl.exp2(s2 - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_tile + v_offs, mask=kn[:, None] < S, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        k_tile += BLOCK_N * stride_ks
        v_tile += BLOCK_N * stride_vs

    pos = start_m + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < P * GROUP) & (pos < S)
    # the sink joins the denominator here, once per row (base-2 units; -inf: no sink): the
    # probabilities of the loop stayed relative to the row's largest score (the largest is 1)
    sink = tl.load(SINKS + head, mask=row_ok, other=float("-inf")) * 1.4426950408889634
    m_all = tl.maximum(m_i, sink)
    keep = tl.exp2(m_i - m_all)
    total = l_i * keep + tl.exp2(sink - m_all)
    out = acc * (keep / total)[:, None]
    tl.store(O + b * stride_ob + pos[:, None] * stride_os + head[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_all + tl.log2(total)) * 0.6931471805599453      # ln(2): log2 -> natural log
    tl.store(LSE + (b * Hq + head) * S + pos, lse, mask=row_ok)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window causal GQA attention forward.

    Args:
        q: ``[B, S, Hq, D]`` bf16/fp16, unit stride on D.
        k, v: ``[B, S, Hkv, D]``, q's dtype, unit stride on D; ``Hq % Hkv == 0``.
        sinks: ``[Hq]`` float32 sink logits (``-inf``: none).
        scale: softmax scale; window: keys per query (>= 1, its own included); softcap: 0 or > 0.

    Returns:
        ``o [B, S, Hq, D]`` (q's dtype) and ``lse [B, Hq, S]`` float32 (natural log, sink included).

    Raises:
        ValueError: inconsistent shapes, a head dim that is not a power of two in [16, 256], a
            window < 1, a negative softcap, or a GQA group larger than every tile.
    """
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    if Hq % Hkv or k.shape != (B, S, Hkv, D) or v.shape != k.shape or sinks.shape != (Hq,):
        raise ValueError(f"bad shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} "
                         f"sinks {tuple(sinks.shape)}")
    if D not in (16, 32, 64, 128, 256) or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("head dim must be a power of two in [16, 256] with unit stride")
    if window < 1 or softcap < 0:
        raise ValueError(f"window must be >= 1 and softcap >= 0 (got {window}, {softcap})")
    G = Hq // Hkv
    W = min(int(window), S)                      # a window past the sequence is plain causal
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    cap = float(softcap)

    def grid(meta):
        return (triton.cdiv(S, meta["BLOCK_M"] // G) * B * Hkv,)

    _swa_fwd_kernel[grid](
        q, k, v, o, lse, sinks, scale * LOG2E, 2.0 * LOG2E * scale / cap if cap > 0 else 0.0, cap * LOG2E,
        S, W, Hkv,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        HEAD_DIM=D, GROUP=G, SOFTCAP=cap > 0,
    )
    return o, lse
