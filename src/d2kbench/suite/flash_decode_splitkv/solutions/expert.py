"""Expert Triton solution: split-KV decode attention (flash-decoding) with GQA head packing.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k_cache, v_cache, cache_seqlens, scale)`` with ``q [B, Hq, D]`` (bf16; fp16 on CPU
smoke workloads), ``k_cache``/``v_cache [B, LMAX, Hkv, D]`` (contiguous per-sequence cache, NaN
in rows at or past the length) and ``cache_seqlens [B]`` int32 on the device; returns
``(o [B, Hq, D] in q's dtype, lse [B, Hq] float32, natural log)``.

Design
------
L1 -- stream every valid K/V byte once, over enough programs to fill the GPU.
    Decode with a handful of long sequences is a pure bandwidth problem, but ``B * Hkv``
    (sequence, KV head) pairs are far fewer than the SMs. Each sequence's keys are cut into
    chunks of ``SPLIT`` tokens (a multiple of every tile, chosen from the shapes so that the
    cache capacity ``B * Hkv * LMAX`` gives a few dozen chunks per SM); a sequence has
    ``ceil(len / SPLIT)`` chunks, so a short context gets one chunk and a long one many, and every
    program does the same amount of work whatever the length mix. Each chunk yields a partial
    output normalised by its own softmax sum plus its log-sum-exp; merging them with weights
    ``2^(lse_c - max lse)`` is exact (the softmax of a union of key sets). The ``G`` query heads
    of a KV head are one program's rows (GQA packing): every K/V tile is read once, not G times.

L2 -- dataflow.
    Stage 1, program = (chunk, KV head, sequence): the length is read on the device; programs
    whose chunk starts past the end write nothing (the merge never reads them). The packed Q
    rows (G padded to the 16-row MMA minimum), the running max / sum and the fp32 accumulator
    stay in registers; each iteration loads a ``[BLOCK_N, D]`` K tile and V tile (contiguous
    rows) and runs ``Q K^T`` and ``P V`` on tensor cores, exp2 with the scale folded in. The
    partial (normalised output, log2-sum-exp) goes to a small fp32 workspace sized by the
    shape. Stage 2, program = (sequence, query head, slice of D): reads the ``ceil(len/SPLIT)``
    partials at once, merges them and writes o (input dtype) and lse (natural log). When the
    whole capacity is one chunk, stage 1 writes o and lse itself and stage 2 is not launched.

L3 -- memory-level parallelism and masking.
    Only the last tile of a chunk can be partial: loads are masked by the chunk end with
    ``other=0``, so the NaN rows past the length are never loaded (a score mask cannot stop
    ``0 * NaN``). Tiles of 64-128 tokens, software-pipelined over several stages, keep enough
    bytes in flight per SM; K/V loads are marked evict-first (read once); addresses are int64.
    The split size is a multiple of every tile candidate, so the autotuner (tile, warps, stages)
    never changes the work division. All launch parameters depend on shapes only: the call is
    CUDA-graph capturable and correct when lengths change between replays.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: Chunks per SM the split aims for at full cache capacity (the real lengths use a fraction of
#: it): many equal chunks balance the schedule when a few sequences are much longer than the rest.
CHUNKS_PER_SM = 32
#: Fewest tokens per chunk (a chunk's fixed cost, its partial and the merge, stays small), and the
#: alignment of the chunk size (a multiple of every BLOCK_N candidate).
MIN_SPLIT = 32 if _INTERPRET else 1024
SPLIT_ALIGN = 32 if _INTERPRET else 256
#: Most chunks per sequence (the merge loads them in one tile).
MAX_CHUNKS = 256


def _configs() -> list[triton.Config]:
    """Autotune candidates (BLOCK_N, warps, stages) for sm_90; shared memory 48-192 KB at D = 128."""
    if _INTERPRET:
        return [triton.Config({"BLOCK_N": 16}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bn, w, s in ((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3))]


@triton.autotune(configs=_configs(), key=["HEAD_DIM", "QROWS", "SPLIT", "DIRECT"])
@triton.jit
def _split_kernel(
    Q, K, V, LENS, OP, LP, O, LSE,
    qk_scale,                                  # scale * log2(e)
    stride_qb, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, QROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
    SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, DIRECT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (MAX_SPLITS, Hkv, B): chunk ``split`` of sequence ``b`` for the GROUP query heads of KV
    head ``kvh`` (rows padded to QROWS). DIRECT (one chunk covers the capacity): writes O and LSE.
    Otherwise writes OP [B, Hq, MAX_SPLITS, D] (fp32 normalised partials) and LP [B, Hq, MAX_SPLITS]
    (log2-sum-exp) for a chunk that starts before the end, nothing for one that does not."""
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(LENS + b)
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, seq_len)

    rows = tl.arange(0, QROWS)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = V + b * stride_vb + kvh.to(tl.int64) * stride_vh

    m_i = tl.full([QROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([QROWS], dtype=tl.float32)
    acc = tl.zeros([QROWS, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        tok = start + offs_n
        ok = tok < hi
        tok64 = tok.to(tl.int64)
        k = tl.load(k_base + tok64[:, None] * stride_kt + offs_d[None, :], mask=ok[:, None], other=0.0,
                    eviction_policy="evict_first")
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + tok64[:, None] * stride_vt + offs_d[None, :], mask=ok[:, None], other=0.0,
                    eviction_policy="evict_first")
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    if DIRECT:
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_i[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
        tl.store(LSE + b * (tl.num_programs(1) * GROUP) + heads, (m_i + tl.log2(l_i)) * 0.6931471805599453,
                 mask=row_ok)
    else:
        keep = row_ok & (lo < seq_len)
        part = (b * (tl.num_programs(1) * GROUP) + heads) * MAX_SPLITS + split        # [QROWS]
        tl.store(OP + part[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=keep[:, None])
        tl.store(LP + part, m_i + tl.log2(l_i), mask=keep)


@triton.jit
def _merge_kernel(OP, LP, LENS, O, LSE, stride_ob, stride_oh, Hq,
                  SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                  HEAD_DIM: tl.constexpr, DC: tl.constexpr):
    """Grid (B * Hq, HEAD_DIM // DC): merge the ceil(len / SPLIT) partials of one (sequence, head)
    row for DC output columns: o = sum_c w_c OP_c / sum_c w_c, w_c = 2^(LP_c - max LP);
    lse = (max LP + log2(sum_c w_c)) * ln 2."""
    row = tl.program_id(0).to(tl.int64)
    dc = tl.program_id(1)
    b = row // Hq
    h = row % Hq
    n = tl.cdiv(tl.load(LENS + b), SPLIT)                  # every chunk < n holds >= 1 token
    c = tl.arange(0, SPLITS_P2)
    c_ok = c < n
    lse2 = tl.load(LP + row * MAX_SPLITS + c, mask=c_ok, other=float("-inf"))
    m = tl.max(lse2, 0)
    w = tl.exp2(lse2 - m)                                  # unread chunks: 2^-inf = 0
    wsum = tl.sum(w, 0)
    offs_d = dc * DC + tl.arange(0, DC)
    part = tl.load(OP + (row * MAX_SPLITS + c)[:, None] * HEAD_DIM + offs_d[None, :], mask=c_ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * part, 0) / wsum
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))
    if dc == 0:
        tl.store(LSE + row, (m + tl.log2(wsum)) * 0.6931471805599453)


def plan_split(B: int, Hkv: int, LMAX: int, sms: int) -> int:
    """Tokens per chunk, from the shapes only (CUDA-graph safe): about ``CHUNKS_PER_SM`` chunks
    per SM over the cache capacity ``B * Hkv * LMAX``, at least ``MIN_SPLIT`` tokens, a multiple
    of ``SPLIT_ALIGN``, at most ``MAX_CHUNKS`` chunks per sequence, and never more than the
    (aligned) capacity itself (then one chunk: no merge)."""
    want = triton.cdiv(B * Hkv * LMAX, CHUNKS_PER_SM * sms)
    split = max(MIN_SPLIT, triton.cdiv(want, SPLIT_ALIGN) * SPLIT_ALIGN, triton.cdiv(LMAX, MAX_CHUNKS))
    split = triton.cdiv(split, SPLIT_ALIGN) * SPLIT_ALIGN
    return min(split, triton.cdiv(LMAX, SPLIT_ALIGN) * SPLIT_ALIGN)


def _sm_count(device: torch.device) -> int:
    if _INTERPRET or device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV GQA decode attention.

    Args:
        q: ``[B, Hq, D]`` bf16/fp16, unit stride on D.
        k_cache, v_cache: ``[B, LMAX, Hkv, D]``, unit stride on D.
        cache_seqlens: ``[B]`` int32 (device), ``1 <= len <= LMAX``.
        scale: softmax scale.

    Returns:
        ``(o [B, Hq, D] in q's dtype, lse [B, Hq] float32, natural log)``.
    """
    B, LMAX, Hkv, D = k_cache.shape
    return run_with_split(q, k_cache, v_cache, cache_seqlens, scale, plan_split(B, Hkv, LMAX, _sm_count(q.device)))


def run_with_split(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                   scale: float, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run` with an explicit chunk size in tokens (a multiple of ``SPLIT_ALIGN``); ``run``
    uses :func:`plan_split`, a tuning sweep may pass others."""
    B, Hq, D = q.shape
    _, LMAX, Hkv, _ = k_cache.shape
    if Hq % Hkv or D not in (16, 32, 64, 128, 256) or q.stride(-1) != 1 or k_cache.stride(-1) != 1 \
            or v_cache.stride(-1) != 1 or split < 1 or split % SPLIT_ALIGN:
        raise ValueError("unsupported shapes, strides or split size")
    group = Hq // Hkv
    qrows = max(16, triton.next_power_of_2(group))
    max_splits = triton.cdiv(LMAX, split)
    direct = max_splits == 1
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq), device=q.device, dtype=torch.float32)
    if direct:
        op, lp = o, lse    # unused
    else:
        op = torch.empty((B, Hq, max_splits, D), device=q.device, dtype=torch.float32)
        lp = torch.empty((B, Hq, max_splits), device=q.device, dtype=torch.float32)
    _split_kernel[(max_splits, Hkv, B)](
        q, k_cache, v_cache, cache_seqlens, op, lp, o, lse, scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o.stride(0), o.stride(1),
        GROUP=group, QROWS=qrows, HEAD_DIM=D, SPLIT=split, MAX_SPLITS=max_splits, DIRECT=direct,
    )
    if not direct:
        dc = min(D, 32)
        _merge_kernel[(B * Hq, D // dc)](op, lp, cache_seqlens, o, lse, o.stride(0), o.stride(1), Hq,
                                         SPLIT=split, MAX_SPLITS=max_splits,
                                         SPLITS_P2=triton.next_power_of_2(max_splits), HEAD_DIM=D, DC=dc,
                                         num_warps=4)
    return o, lse
