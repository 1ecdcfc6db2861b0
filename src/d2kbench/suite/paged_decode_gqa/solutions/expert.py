"""Expert Triton solution: paged-KV GQA decode attention with GQA head packing and split-K.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k_cache, v_cache, block_tables, seq_lens, scale)`` with ``q [B, Hq, D]`` (bf16; fp16
on CPU smoke workloads), ``k_cache``/``v_cache [NB, BS, Hkv, D]`` (NHD pages, NaN in slots
that hold no valid token), ``block_tables [B, MAXB]`` int32 and ``seq_lens [B]`` int32 on the
device; returns ``o [B, Hq, D]`` in q's dtype.

Design
------
L1 -- read every valid K/V byte exactly once; split long contexts.
    Decode is bound by the K/V bytes. One program serves all ``G = Hq / Hkv`` query heads of a
    KV head (GQA head packing): the G query rows, padded to the 16-row MMA minimum, form the
    left operand of ``tl.dot`` against a K tile, so each K/V tile is read once per KV head
    instead of G times, and both products run on tensor cores. When ``B * Hkv`` programs
    cannot fill the GPU (long contexts, few sequences), each sequence's tokens are split into
    ``NUM_SPLITS`` equal, tile-aligned segments processed by separate programs; each writes its
    normalised partial output and log-sum-exp, and a small combine kernel merges the segments
    with LSE weights (exact: the softmax of a union of key sets).

L2 -- dataflow.
    Program = (sequence, KV head[, segment]). Sequence length and split bounds are read on the
    device (no host synchronisation: the call is CUDA-graph capturable and the schedule depends
    only on shapes). The packed Q rows stay in registers; each iteration translates a tile of
    logical token positions to (page, slot) through the block table (page size is a
    compile-time constant, so the division is a multiply-shift and pages need not divide the
    tile), gathers a [tile, D] K block and V block, and updates the running max / sum /
    accumulator (exp2, scale folded) in registers. Without a split the epilogue writes the bf16
    output directly; with a split, fp32 partials (``[B, Hq, splits, D]`` plus LSE) go to a
    small workspace that the combine kernel reads once.

L3 -- memory-level parallelism and masking.
    Only tokens ``>= seq_len`` are masked, and masked K/V loads use ``other=0`` so the NaN
    poison of unwritten slots is never loaded (a score mask alone cannot stop 0 * NaN).
    Page-table entries are loaded for the tile, the K/V gathers are 16-byte vectorised rows
    (one token's head is D contiguous elements) and software-pipelined over several stages so
    that enough bytes are in flight per SM; page and slot offsets are int64. The split count
    comes from ``B * Hkv`` against the SM count; a short autotune list (tile, warps, stages)
    keyed on head dim, page size and group size picks the tile.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
#: Programs per SM a split aims for: several resident programs hide latency and the many
#: segments of unequal sequences balance the tail of the schedule.
PROGRAMS_PER_SM = 8
#: Fewest tokens a split segment should hold (below this the combine costs more than it saves).
MIN_TOKENS_PER_SPLIT = 16 if _INTERPRET else 256


def _configs() -> list[triton.Config]:
    """Autotune candidates (BLOCK_N, num_warps, num_stages). Kept to four (three at D = 256): the
    first call tunes every candidate once per (HEAD_DIM, PAGE, GROUP, NUM_SPLITS) key, and the
    registered workloads have seven keys (NUM_SPLITS is a constexpr: one compile per candidate
    and key). sm_90 shared memory: 21-74 KB at D = 128."""
    if _INTERPRET:
        return [triton.Config({"BLOCK_N": 16}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bn, w, s in ((64, 4, 3), (128, 4, 3), (64, 8, 3), (32, 4, 4))]


def _prune(configs, named_args, **kwargs):
    """At head dim 256 a 128-token K/V stage pair would not fit two stages in shared memory."""
    if _INTERPRET:
        return configs
    d = named_args.get("HEAD_DIM", kwargs.get("HEAD_DIM"))
    kept = [c for c in configs if not (d is not None and d > 128 and c.kwargs["BLOCK_N"] > 64)]
    return kept or configs


@triton.autotune(configs=_configs(), key=["HEAD_DIM", "PAGE", "GROUP", "NUM_SPLITS"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _paged_decode_kernel(
    Q, KC, VC, BT, SL, O, OP, LP,
    qk_scale,                                   # scale * log2(e)
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_bt,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, QROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (B, Hkv, NUM_SPLITS). Rows = the GROUP query heads of KV head ``kvh`` (padded to QROWS).

    NUM_SPLITS == 1: writes O [B, Hq, D] directly. Otherwise writes OP [B, Hq, NUM_SPLITS, D]
    (fp32, normalised partial outputs) and LP [B, Hq, NUM_SPLITS] (fp32 log2-sum-exp, -inf for
    an empty segment).
    """
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SL + b)
    seg = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N   # tile-aligned equal shares
    lo = split * seg
    hi = tl.minimum(lo + seg, seq_len)

    rows = tl.arange(0, QROWS)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)

    bt_row = BT + b.to(tl.int64) * stride_bt
    k_head = KC + kvh.to(tl.int64) * stride_kh
    v_head = VC + kvh.to(tl.int64) * stride_vh
    m_i = tl.full([QROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([QROWS], dtype=tl.float32)
    acc = tl.zeros([QROWS, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        tok = start + offs_n
        tok_ok = tok < hi
        page = tl.load(bt_row + tok // PAGE, mask=tok_ok, other=0).to(tl.int64)
        slot = (tok % PAGE).to(tl.int64)
        k = tl.load(k_head + (page * stride_kp + slot * stride_ks)[:, None] + offs_d[None, :],
                    mask=tok_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + (page * stride_vp + slot * stride_vs)[:, None] + offs_d[None, :],
                    mask=tok_ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        nonempty = l_i > 0
        out = tl.where(nonempty[:, None], acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
        lse2 = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        part = (b.to(tl.int64) * (tl.num_programs(1) * GROUP) + heads) * NUM_SPLITS + split   # [QROWS]
        tl.store(OP + part[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
        tl.store(LP + part, lse2, mask=row_ok)


@triton.jit
def _combine_kernel(OP, LP, O, stride_ob, stride_oh,
                    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Grid (B, Hq): o = sum_s w_s * OP_s / sum_s w_s with w_s = 2^(LP_s - max LP)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    row = b * tl.num_programs(1) + h
    s = tl.arange(0, SPLITS_P2)
    s_ok = s < NUM_SPLITS
    lse = tl.load(LP + row * NUM_SPLITS + s, mask=s_ok, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))                       # empty segments: 2^-inf = 0
    offs_d = tl.arange(0, HEAD_DIM)
    part = tl.load(OP + (row * NUM_SPLITS + s)[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * part, 0) / tl.sum(w, 0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))


def plan_splits(units: int, capacity: int, sms: int) -> int:
    """Number of key segments per (sequence, KV head) program: 1 when ``units = B * Hkv``
    programs already give every SM a couple of programs, else enough to reach about
    ``PROGRAMS_PER_SM`` programs per SM, without segments shorter than ``MIN_TOKENS_PER_SPLIT``
    tokens at the table's capacity. Depends on shapes only (CUDA-graph safe)."""
    if units >= 2 * sms:
        return 1
    want = triton.cdiv(PROGRAMS_PER_SM * sms, units)
    return max(1, min(want, capacity // MIN_TOKENS_PER_SPLIT))


def _sm_count(device: torch.device) -> int:
    if _INTERPRET or device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Paged GQA decode attention.

    Args:
        q: ``[B, Hq, D]`` bf16/fp16, unit stride on D.
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` pages, unit stride on D.
        block_tables: ``[B, MAXB]`` int32 (device); seq_lens: ``[B]`` int32 (device), >= 1.
        scale: softmax scale.

    Returns:
        ``o [B, Hq, D]`` in q's dtype.
    """
    splits = plan_splits(q.shape[0] * k_cache.shape[2], block_tables.shape[1] * k_cache.shape[1], _sm_count(q.device))
    return run_with_splits(q, k_cache, v_cache, block_tables, seq_lens, scale, splits)


def run_with_splits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, scale: float, splits: int) -> torch.Tensor:
    """:func:`run` with an explicit number of key segments per (sequence, KV head) (>= 1);
    used by ``run`` with :func:`plan_splits` and by the GPU calibration script to sweep it."""
    B, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    if Hq % Hkv or D not in (16, 32, 64, 128, 256) or q.stride(-1) != 1 or k_cache.stride(-1) != 1 \
            or v_cache.stride(-1) != 1 or splits < 1:
        raise ValueError("unsupported shapes, strides or split count")
    group = Hq // Hkv
    qrows = max(16, triton.next_power_of_2(group))
    o = torch.empty_like(q)
    if splits == 1:
        op, lp = o, o    # unused
    else:
        op = torch.empty((B, Hq, splits, D), device=q.device, dtype=torch.float32)
        lp = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    _paged_decode_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, o, op, lp, scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), o.stride(0), o.stride(1),
        GROUP=group, QROWS=qrows, HEAD_DIM=D, PAGE=BS, NUM_SPLITS=splits,
    )
    if splits > 1:
        _combine_kernel[(B, Hq)](op, lp, o, o.stride(0), o.stride(1), NUM_SPLITS=splits,
                                 SPLITS_P2=triton.next_power_of_2(splits), HEAD_DIM=D, num_warps=4)
    return o
