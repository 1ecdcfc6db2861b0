"""Expert Triton solution: cascade (shared-prefix) decode with one pass over the shared prefix.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k_cache, v_cache, block_tables, seq_lens, common_prefix_len, scale)`` with
``q [N, Hq, D]`` (bf16; fp16 on CPU smoke workloads), ``k_cache``/``v_cache [NB, BS, Hkv, D]``
(NHD pages, NaN in slots that hold no valid token), ``block_tables [N, MAXB]`` int32 (the first
``P // BS`` entries of every row are the same physical pages, ``P = common_prefix_len``) and
``seq_lens [N]`` int32 (``>= P``) on the device; returns ``o [N, Hq, D]`` in q's dtype.

Design
------
L1 -- read the shared prefix once for all requests; merge through the LSE.
    Attention over a context is exact when the keys are split into the prefix and the suffix and
    the two softmax results are merged with their log-sum-exp weights. The shared part is the
    ``P // BS`` physically shared pages (``S0 = P // BS * BS`` tokens; when P ends mid-page, the
    last prefix page is each request's own copy and is read with that request's suffix). It is
    the same keys for every query: per KV head it is one dense attention of the ``N * G`` (request,
    query head) rows against ``P`` keys, so the prefix K/V are streamed from HBM once (each row
    tile re-reads them from L2) instead of once per request, and ``Q K^T`` / ``P V`` become real
    tensor-core matrix products (64-row tiles) instead of N memory-bound decodes. The suffix part
    is an ordinary GQA-packed paged decode of each request's own pages, starting at token ``S0``.

L2 -- dataflow.
    One launch holds both kinds of programs. Prefix programs (KV head, prefix chunk, row tile):
    a 64-row Q tile gathered from ``q`` by row -> (request, head), the prefix pages taken from row
    0 of the block table (they are the same pages in every row), online softmax over the chunk, a normalised fp32 partial and its
    log2-sum-exp written per (request, head, chunk). Suffix programs (request, KV head, suffix
    chunk): the G heads of the request padded to 16 rows, its own pages from token ``S0`` (or from
    the chunk start) to its length; same partial format. A merge kernel per (request, head, slice
    of D) combines the non-empty partials (prefix chunks below ``S0``, suffix chunks below the
    request's suffix length: an empty suffix contributes nothing) and writes o.

L3 -- execution.
    Prefix programs come first in the grid and number about one per SM, so every SM holds one of
    them (tensor-core bound, its K/V from L2) next to a stream of suffix programs (HBM bound,
    dispatched as slots free up): the two halves of the work overlap instead of running in
    sequence. The row tiles of one (KV head, chunk) are adjacent in the grid, so its pages are
    read from HBM once and from L2 by the others. Both kinds use 4 warps and 64-token tiles
    gathered through the block table (page and slot per token: the prefix may end mid-page),
    software-pipelined; masked loads (``other=0``) never touch NaN slots. The prefix chunk count
    comes from the row tiles and the SM count, the suffix split from the (request, KV head)
    pairs against the SMs: shapes and the host int ``P`` only (CUDA-graph capturable). Inside the
    kernels ``P`` denotes ``S0``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
#: Rows of a prefix tile (one warpgroup's MMA height) and tokens a chunk size is a multiple of.
BLOCK_M = 16 if _INTERPRET else 64
ALIGN = 16 if _INTERPRET else 128
#: Fewest tokens in a prefix chunk and in a suffix chunk.
MIN_PREFIX_CHUNK = 16 if _INTERPRET else 512
MIN_SUFFIX_CHUNK = 16 if _INTERPRET else 512
#: Suffix programs per SM below which the suffixes are split (over the suffix capacity).
SUFFIX_PROGRAMS_PER_SM = 4


def _configs() -> list[triton.Config]:
    """Autotune candidates (BLOCK_N, stages), 4 warps (the prefix tile's warpgroup); sm_90 shared
    memory 64-112 KB at D = 128, so two programs (one prefix, one suffix) fit on an SM."""
    if _INTERPRET:
        return [triton.Config({"BLOCK_N": 16}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_N": bn}, num_warps=4, num_stages=s) for bn, s in ((64, 2), (64, 3), (32, 3))]


@triton.jit
def _online_step(q, k, v, ok, m_i, l_i, acc, qk_scale):
    """One tile of the online softmax: scores of the rows ``q`` against K, rescale, accumulate P V."""
    s = tl.dot(q, tl.trans(k)) * qk_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _attend_pages(q, bt_row, k_head, v_head, lo, hi, qk_scale, stride_kp, stride_ks, stride_vp, stride_vs,
                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax of the rows ``q`` over tokens [lo, hi) of one block-table row: (m, l, acc)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        tok = start + offs_n
        ok = tok < hi
        page = tl.load(bt_row + tok // PAGE, mask=ok, other=0).to(tl.int64)
        slot = (tok % PAGE).to(tl.int64)
        k = tl.load(k_head + (page * stride_kp + slot * stride_ks)[:, None] + offs_d[None, :],
                    mask=ok[:, None], other=0.0)
        v = tl.load(v_head + (page * stride_vp + slot * stride_vs)[:, None] + offs_d[None, :],
                    mask=ok[:, None], other=0.0)
        m_i, l_i, acc = _online_step(q, k, v, ok, m_i, l_i, acc, qk_scale)
    return m_i, l_i, acc


@triton.jit
def _store_partial(OP, LP, part, keep, m_i, l_i, acc, HEAD_DIM: tl.constexpr):
    """Write rows ``part`` of the partial workspace: normalised output and log2-sum-exp."""
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(OP + part[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=keep[:, None])
    tl.store(LP + part, m_i + tl.log2(l_i), mask=keep)


@triton.jit
def _prefix_program(Q, KC, VC, BT, OP, LP, pid, qk_scale, P, N, PC, stride_qn, stride_qh,
                    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                    HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                    ROW_TILES: tl.constexpr, NPC: tl.constexpr, NSLOTS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Prefix chunk ``c`` for row tile ``rt`` of the (request, query head) pairs of KV head ``kvh``
    (row r -> request r // GROUP, head kvh * GROUP + r % GROUP); keys through block-table row 0."""
    rt = pid % ROW_TILES
    c = (pid // ROW_TILES) % NPC
    kvh = pid // (ROW_TILES * NPC)
    r = rt * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = r < N * GROUP
    req = (r // GROUP).to(tl.int64)
    head = kvh * GROUP + r % GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + req[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                mask=r_ok[:, None], other=0.0)
    lo = c * PC
    hi = tl.minimum(lo + PC, P)
    m_i, l_i, acc = _attend_pages(q, BT, KC + kvh.to(tl.int64) * stride_kh, VC + kvh.to(tl.int64) * stride_vh,
                                  lo, hi, qk_scale, stride_kp, stride_ks, stride_vp, stride_vs,
                                  BLOCK_M, HEAD_DIM, PAGE, BLOCK_N)
    _store_partial(OP, LP, (req * (HKV * GROUP) + head) * NSLOTS + c, r_ok & (lo < P), m_i, l_i, acc, HEAD_DIM)


@triton.jit
def _suffix_program(Q, KC, VC, BT, SL, OP, LP, ps, qk_scale, P, SC, stride_qn, stride_qh,
                    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
                    HKV: tl.constexpr, GROUP: tl.constexpr, QROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    PAGE: tl.constexpr, NPC: tl.constexpr, NSC: tl.constexpr, NSLOTS: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """Suffix chunk ``c`` of request ``i`` for the GROUP query heads of KV head ``kvh`` (rows padded
    to QROWS): tokens from P + c * SC to the request's length, through its own table row."""
    c = ps % NSC
    kvh = (ps // NSC) % HKV
    i = (ps // (NSC * HKV)).to(tl.int64)
    seq_len = tl.load(SL + i)
    rows = tl.arange(0, QROWS)
    row_ok = rows < GROUP
    heads = kvh * GROUP + rows
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + i * stride_qn + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lo = P + c * SC
    hi = tl.minimum(lo + SC, seq_len)
    m_i, l_i, acc = _attend_pages(q, BT + i * stride_bt, KC + kvh.to(tl.int64) * stride_kh,
                                  VC + kvh.to(tl.int64) * stride_vh, lo, hi, qk_scale,
                                  stride_kp, stride_ks, stride_vp, stride_vs, QROWS, HEAD_DIM, PAGE, BLOCK_N)
    _store_partial(OP, LP, (i * (HKV * GROUP) + heads) * NSLOTS + NPC + c, row_ok & (lo < seq_len),
                   m_i, l_i, acc, HEAD_DIM)


@triton.autotune(configs=_configs(), key=["HEAD_DIM", "GROUP", "PAGE", "NPC", "NSC"])
@triton.jit
def _cascade_kernel(
    Q, KC, VC, BT, SL, OP, LP,
    qk_scale, P, N, PC, SC,
    stride_qn, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_bt,
    HKV: tl.constexpr, GROUP: tl.constexpr, QROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    ROW_TILES: tl.constexpr, NPC: tl.constexpr, NSC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (HKV * NPC * ROW_TILES + N * HKV * NSC,): prefix programs first, then suffix programs.

    Both write partials OP [N, Hq, NPC + NSC, D] (fp32, normalised) and LP [N, Hq, NPC + NSC]
    (log2-sum-exp): slot c < NPC for prefix chunk c, slot NPC + c for suffix chunk c. A chunk
    without tokens writes nothing (the merge does not read it)."""
    pid = tl.program_id(0)
    n_pre = HKV * NPC * ROW_TILES
    if pid < n_pre:
        _prefix_program(Q, KC, VC, BT, OP, LP, pid, qk_scale, P, N, PC, stride_qn, stride_qh,
                        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                        HKV, GROUP, HEAD_DIM, PAGE, ROW_TILES, NPC, NPC + NSC, BLOCK_M, BLOCK_N)
    else:
        _suffix_program(Q, KC, VC, BT, SL, OP, LP, pid - n_pre, qk_scale, P, SC, stride_qn, stride_qh,
                        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
                        HKV, GROUP, QROWS, HEAD_DIM, PAGE, NPC, NSC, NPC + NSC, BLOCK_N)


@triton.jit
def _merge_kernel(OP, LP, SL, O, stride_on, stride_oh, P, PC, SC, Hq,
                  NPC: tl.constexpr, NSC: tl.constexpr, SLOTS_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                  DC: tl.constexpr):
    """Grid (N * Hq, HEAD_DIM // DC): o = sum_j w_j OP_j / sum_j w_j over the non-empty slots j of
    one (request, head) row (prefix chunks below P, suffix chunks below the suffix length),
    w_j = 2^(LP_j - max LP)."""
    row = tl.program_id(0).to(tl.int64)
    dc = tl.program_id(1)
    i = row // Hq
    h = row % Hq
    suffix = tl.load(SL + i) - P
    NSLOTS: tl.constexpr = NPC + NSC
    j = tl.arange(0, SLOTS_P2)
    ok = ((j < NPC) & (j * PC < P)) | ((j >= NPC) & (j < NSLOTS) & ((j - NPC) * SC < suffix))
    lse2 = tl.load(LP + row * NSLOTS + j, mask=ok, other=float("-inf"))
    m = tl.max(lse2, 0)
    w = tl.exp2(lse2 - m)
    offs_d = dc * DC + tl.arange(0, DC)
    part = tl.load(OP + (row * NSLOTS + j)[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * part, 0) / tl.sum(w, 0)
    tl.store(O + i * stride_on + h * stride_oh + offs_d, out.to(O.dtype.element_ty))


def plan(N: int, Hq: int, Hkv: int, P: int, suffix_capacity: int, sms: int) -> tuple[int, int, int, int]:
    """``(NPC, PC, NSC, SC)``: prefix chunks and their size in tokens, suffix chunks and their size,
    from shapes, ``P`` and the SM count only (CUDA-graph safe).

    Prefix: about one prefix program per SM (``Hkv * row tiles * NPC``), chunks of at least
    ``MIN_PREFIX_CHUNK`` tokens; no prefix programs when ``P == 0``. Suffix: one chunk per
    (request, KV head) when those pairs give every SM ``SUFFIX_PROGRAMS_PER_SM`` programs, else
    enough chunks of at least ``MIN_SUFFIX_CHUNK`` tokens (over the suffix capacity) to do so."""
    row_tiles = triton.cdiv(N * (Hq // Hkv), BLOCK_M)
    if P > 0:
        npc = max(1, min(round(sms / (Hkv * row_tiles)), triton.cdiv(P, MIN_PREFIX_CHUNK)))
        pc = triton.cdiv(triton.cdiv(P, npc), ALIGN) * ALIGN
        npc = triton.cdiv(P, pc)
    else:
        npc, pc = 0, ALIGN
    cap = max(1, suffix_capacity)
    units = N * Hkv
    nsc = 1 if units >= SUFFIX_PROGRAMS_PER_SM * sms else \
        max(1, min(triton.cdiv(SUFFIX_PROGRAMS_PER_SM * sms, units), triton.cdiv(cap, MIN_SUFFIX_CHUNK)))
    sc = triton.cdiv(triton.cdiv(cap, nsc), ALIGN) * ALIGN
    return npc, pc, triton.cdiv(cap, sc), sc


def _sm_count(device: torch.device) -> int:
    if _INTERPRET or device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, common_prefix_len: int, scale: float) -> torch.Tensor:
    """Cascade decode: prefix once for all requests, each suffix on its own, LSE merge.

    Args:
        q: ``[N, Hq, D]`` bf16/fp16, unit stride on D.
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` pages, unit stride on D.
        block_tables: ``[N, MAXB]`` int32 (device); seq_lens: ``[N]`` int32 (device), ``>= P``.
        common_prefix_len: ``P`` (host int), the shared leading tokens.
        scale: softmax scale.

    Returns:
        ``o [N, Hq, D]`` in q's dtype.
    """
    N, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    if Hq % Hkv or D not in (16, 32, 64, 128, 256) or q.stride(-1) != 1 or k_cache.stride(-1) != 1 \
            or v_cache.stride(-1) != 1 or common_prefix_len < 0:
        raise ValueError("unsupported shapes, strides or prefix length")
    # the shared part is the physically shared pages; prefix tokens in a request's own last
    # prefix page (P not a multiple of BS) are read per request, with its suffix
    P = int(common_prefix_len) // BS * BS
    group = Hq // Hkv
    npc, pc, nsc, sc = plan(N, Hq, Hkv, P, block_tables.shape[1] * BS - P, _sm_count(q.device))
    row_tiles = triton.cdiv(N * group, BLOCK_M)
    slots = npc + nsc
    op = torch.empty((N, Hq, slots, D), device=q.device, dtype=torch.float32)
    lp = torch.empty((N, Hq, slots), device=q.device, dtype=torch.float32)
    grid = (Hkv * npc * row_tiles + N * Hkv * nsc,)
    _cascade_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, op, lp, scale * LOG2E, P, N, pc, sc,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        HKV=Hkv, GROUP=group, QROWS=max(16, triton.next_power_of_2(group)), HEAD_DIM=D, PAGE=BS,
        ROW_TILES=row_tiles, NPC=npc, NSC=nsc, BLOCK_M=BLOCK_M,
    )
    o = torch.empty_like(q)
    dc = min(D, 32)
    _merge_kernel[(N * Hq, D // dc)](op, lp, seq_lens, o, o.stride(0), o.stride(1), P, pc, sc, Hq,
                                     NPC=npc, NSC=nsc, SLOTS_P2=triton.next_power_of_2(slots), HEAD_DIM=D, DC=dc,
                                     num_warps=4)
    return o
