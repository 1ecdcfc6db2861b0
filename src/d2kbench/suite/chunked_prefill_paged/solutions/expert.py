"""Expert Triton solution: chunked prefill ("extend") attention over a paged prefix, with the
new tokens' keys and values written into the paged cache in the same launch.

Contract (identical to ``reference.run``)
------------------------------------------
``run(q, k_new, v_new, cu_seqlens_q, k_cache, v_cache, block_tables, context_lens,
slot_mapping, max_seqlen_q, max_context_len, scale)`` with ``q [T, Hq, D]``, ``k_new, v_new
[T, Hkv, D]``, NHD pages ``k_cache, v_cache [NB, BS, Hkv, D]`` (updated in place at
``slot_mapping``), int32 device metadata; returns ``o [T, Hq, D]`` in q's dtype.

Design
------
L1 -- two key ranges, one softmax, one launch.
    The keys of new token ``r`` of request ``i`` are (a) the ``ctx_i`` cached tokens, which every
    new token sees (dense tiles, unmasked except the last partial one), read through the block
    table; and (b) the chunk's own tokens ``0 .. r``, a causal triangle read straight from the
    contiguous ``k_new``/``v_new`` (no round trip through the cache, no dependency on the cache
    write). One online-softmax state (running max in scaled log2 units, running sum, fp32
    accumulator) spans both ranges. Prefill tiles (``128 / G`` tokens x the G query heads of one
    KV head) and decode-sized requests (a 16-row tile: one token x G heads) are items of the same
    work list and run in the same launch, through two code paths of one kernel. The required
    cache write is fused: in its diagonal key tiles the program that owns a query tile stores the
    K and V rows of its own tokens at their slots, so every new token is written exactly once, for
    each KV head, by exactly one program.

L2 -- device-built cost-sorted work list, decodes spread through it.
    Two tiny pre-kernels turn ``cu_seqlens_q``/``context_lens`` into the list every call: the
    first counts each request's tiles and lays them out (an exclusive scan in one program), each
    with its cost in keys (``ctx_i`` + the tile's last position); the second sorts the prefill
    tiles by cost, longest first (longest-processing-time order: the rank of an item is the
    number of items of its class ahead of it, computed by comparison blocks; no host
    synchronisation, CUDA-graph capturable), and spreads the decode-sized items evenly between
    them. A decode item streams its context from HBM with almost no tensor-core work: spread
    out, a few SMs at a time stream while the others compute, so the decode bytes overlap the
    prefill MMAs; sorted to the tail, all SMs would stream at once and the step would end with a
    bandwidth-bound phase of ~0.5 ms on the Llama-3.1-8B mixed step. Program ``p`` of the
    attention kernel takes list item ``p // Hkv`` and KV head ``p % Hkv``, so a request's tiles
    of one KV head run close in time and share its context pages in L2. Within a program: Q
    resident, m / l / acc in registers, P cast straight into the PV product, one normalisation
    at the end.

L3 -- Hopper mapping.
    128-row tiles on 8 warps with 64-key tiles (D <= 128); the context loop is
    software-pipelined over three buffers (``tl.range(num_stages=3)``: predicated async copies of
    the gathered page rows; the page id of each key is one small load from the table row); the
    chunk loop masks only the band tiles. Its K/V tiles feed only the two MMAs: the fused cache
    write loads its own rows separately (L2-hot). Reusing the pipelined tiles for the write gave
    them a second consumer, and Triton 3.6 then single-buffered them in shared memory while still
    issuing the P.V wgmma asynchronously, so the next tile's copy (zero-filled where masked, at a
    chunk's end) overwrote V before the wgmma had read it: wrong rows on the H200 that the
    interpreter cannot show (adversarial edge lengths); the sm_90 test of
    tests/test_task_chunked_prefill_paged.py scans the compiled kernel for that race. The page size is a compile-time constant (page id and
    slot of a key by shift and mask at BS = 16; any page size works). Page and slot arithmetic
    in int64; the block-table load of the partial context tile is masked (a table entry past the
    request's pages is never followed into a NaN page). sm_90 (ptxas, D = 128, both paths in
    one kernel): 252-254 registers on 8 warps (one CTA per SM), 96 KB of shared memory, no
    spills.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
#: Requests per step of the tile-count kernel.
COUNT_BLOCK = 128
#: Work items per program (rows) and per comparison step (columns) of the sort kernel.
RANK_ROWS = 64
RANK_COLS = 64


def tile_config(D: int, G: int) -> dict:
    """Tiles of the attention kernel for head dim ``D`` and group size ``G``.

    ``BLOCK_M`` rows of a prefill tile (``BLOCK_M // G`` tokens x G heads), ``SMALL_M`` rows of a
    decode-sized tile (requests of at most ``SMALL_M // G`` new tokens), ``BLOCK_N`` keys per step.

    Raises:
        ValueError: a group larger than the small tile.
    """
    small = max(16, triton.next_power_of_2(G))
    if _INTERPRET:
        cfg = {"BLOCK_M": 32, "SMALL_M": small, "BLOCK_N": 16, "CTX_STAGES": 0, "num_warps": 1, "num_stages": 1}
    elif D <= 64:
        cfg = {"BLOCK_M": 128, "SMALL_M": small, "BLOCK_N": 64, "CTX_STAGES": 3, "num_warps": 4, "num_stages": 2}
    elif D <= 128:
        cfg = {"BLOCK_M": 128, "SMALL_M": small, "BLOCK_N": 64, "CTX_STAGES": 3, "num_warps": 8, "num_stages": 2}
    else:
        cfg = {"BLOCK_M": 128, "SMALL_M": small, "BLOCK_N": 32, "CTX_STAGES": 2, "num_warps": 8, "num_stages": 2}
    if G > cfg["SMALL_M"] or G > cfg["BLOCK_M"] // 2 or small > 64:
        raise ValueError(f"GQA group of {G} query heads is too large for the {cfg['BLOCK_M']}-row tile")
    return cfg


@triton.jit
def _count_kernel(CU, CTX, WREQ, WTILE, WCOST, N, n_slots,
                  P: tl.constexpr, SMALL_Q: tl.constexpr, RB: tl.constexpr):
    """One program: request ``r`` has ``n_r`` items (one decode-sized item, tile -1, when
    ``q_r <= SMALL_Q``, else ``cdiv(q_r, P)`` prefill tiles), laid out at the exclusive scan of the
    counts; item ``t`` costs ``ctx_r + min((t + 1) P, q_r)`` keys. Slots past the total get
    request -1 and cost -1."""
    carry = 0
    for r0 in range(0, N, RB):
        r = r0 + tl.arange(0, RB)
        ok = r < N
        b0 = tl.load(CU + r, mask=ok, other=0)
        ql = tl.load(CU + r + 1, mask=ok, other=0) - b0
        ctx = tl.load(CTX + r, mask=ok, other=0)
        n = tl.where(ok & (ql > 0), tl.where(ql <= SMALL_Q, 1, (ql + P - 1) // P), 0)
        start = carry + tl.cumsum(n, 0) - n
        for t in range(0, tl.max(n, axis=0)):
            m = t < n
            last = tl.where(ql <= SMALL_Q, ql, tl.minimum((t + 1) * P, ql))
            tl.store(WREQ + start + t, r, mask=m)
            tl.store(WTILE + start + t, tl.where(ql <= SMALL_Q, -1, tl.full([RB], 0, tl.int32) + t), mask=m)
            tl.store(WCOST + start + t, ctx + last, mask=m)
        carry += tl.sum(n, axis=0)
    for e0 in range(carry, n_slots, RB):
        e = e0 + tl.arange(0, RB)
        tl.store(WREQ + e, tl.full([RB], -1, tl.int32), mask=e < n_slots)
        tl.store(WCOST + e, tl.full([RB], -1, tl.int32), mask=e < n_slots)


@triton.jit
def _rank_kernel(WREQ, WTILE, WCOST, TREQ, TTILE, n_slots, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Order the items. Within each class (prefill tiles; decode-sized items, tile -1; empty
    slots, request -1) an item's rank is ``#{j : cost_j > cost_i or (cost_j == cost_i and j < i)}``
    (largest cost first, ties by position). The ``nb`` prefill tiles keep that order and the
    ``ns`` decode-sized items are spread evenly between them: decode item ``r`` follows
    ``floor((r + 1) nb / (ns + 1))`` prefill tiles, so prefill tile ``j`` follows
    ``min(ns, ceil((j + 1)(ns + 1) / nb) - 1)`` decode items (a merge: a permutation of the
    ``nb + ns`` first slots); empty slots go last."""
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = i < n_slots
    ri = tl.load(WREQ + i, mask=ok, other=-1)
    ti = tl.load(WTILE + i, mask=ok, other=0)
    ci = tl.load(WCOST + i, mask=ok, other=-1)
    cls_i = tl.where(ri < 0, 2, tl.where(ti < 0, 1, 0))
    rank = tl.zeros([ROWS], dtype=tl.int32)
    nb = 0
    ns = 0
    for c0 in range(0, n_slots, COLS):
        j = c0 + tl.arange(0, COLS)
        jok = j < n_slots
        rj = tl.load(WREQ + j, mask=jok, other=-1)
        tj = tl.load(WTILE + j, mask=jok, other=0)
        cj = tl.load(WCOST + j, mask=jok, other=-1)
        cls_j = tl.where(jok, tl.where(rj < 0, 2, tl.where(tj < 0, 1, 0)), 3)
        ahead = (cls_j[None, :] == cls_i[:, None]) & (
            (cj[None, :] > ci[:, None]) | ((cj[None, :] == ci[:, None]) & (j[None, :] < i[:, None])))
        rank += tl.sum(ahead.to(tl.int32), axis=1)
        nb += tl.sum((cls_j == 0).to(tl.int32), axis=0)
        ns += tl.sum((cls_j == 1).to(tl.int32), axis=0)
    nb_safe = tl.maximum(nb, 1)
    big_slot = rank + tl.minimum(ns, ((rank + 1) * (ns + 1) + nb_safe - 1) // nb_safe - 1)
    small_slot = rank + ((rank + 1) * nb) // (ns + 1)
    slot = tl.where(cls_i == 0, big_slot, tl.where(cls_i == 1, small_slot, nb + ns + rank))
    tl.store(TREQ + slot, ri, mask=ok)
    tl.store(TTILE + slot, ti, mask=ok)


@triton.jit
def _update(qk, acc, m_i, l_i, v, qk_scale):
    """Online-softmax step on raw scores ``qk`` (masked entries -inf); max in scaled log2 units."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _attend(Q, KN, VN, KC, VC, O, BT, SLOT, qk_scale,
            q0, ql, ctx, req, kvh, start_m,
            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
            stride_cp, stride_cs, stride_ch, stride_bt, BS: tl.constexpr,
            GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BM: tl.constexpr, BLOCK_N: tl.constexpr,
            CTX_STAGES: tl.constexpr):
    """One tile: rows ``r`` = token ``start_m + r // GROUP`` of the chunk x query head
    ``kvh * GROUP + r % GROUP``; keys = the context (through the table) then the chunk (causal);
    the tile's own tokens' K/V rows are stored into the cache on the band tiles."""
    P: tl.constexpr = BM // GROUP
    r = tl.arange(0, BM)
    pos = start_m + r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = (r < P * GROUP) & (pos < ql)
    end_m = tl.minimum(start_m + P, ql)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q0_64 = q0.to(tl.int64)
    q = tl.load(Q + (q0_64 + pos[:, None]) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, HEAD_DIM], dtype=tl.float32)

    # (a) the cached context: dense tiles through the block table, unmasked
    bt_row = BT + req.to(tl.int64) * stride_bt
    head_off = kvh.to(tl.int64) * stride_ch
    full_n = (ctx // BLOCK_N) * BLOCK_N
    for start_n in tl.range(0, full_n, BLOCK_N, num_stages=CTX_STAGES if CTX_STAGES > 0 else None):
        kn = start_n + offs_n
        page = tl.load(bt_row + kn // BS).to(tl.int64)
        row = page * stride_cp + (kn % BS).to(tl.int64) * stride_cs + head_off
        k = tl.load(KC + row[:, None] + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k))
        v = tl.load(VC + row[:, None] + offs_d[None, :])
        acc, m_i, l_i = _update(qk, acc, m_i, l_i, v, qk_scale)
    if full_n < ctx:   # the last, partial context tile: table, keys and values masked at load
        kn = full_n + offs_n
        kok = kn < ctx
        page = tl.load(bt_row + kn // BS, mask=kok, other=0).to(tl.int64)
        row = page * stride_cp + (kn % BS).to(tl.int64) * stride_cs + head_off
        k = tl.load(KC + row[:, None] + offs_d[None, :], mask=kok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        qk = tl.where(kok[None, :], qk, float("-inf"))
        v = tl.load(VC + row[:, None] + offs_d[None, :], mask=kok[:, None], other=0.0)
        acc, m_i, l_i = _update(qk, acc, m_i, l_i, v, qk_scale)

    # (b) the chunk itself: contiguous k_new / v_new up to the diagonal; the causal mask and the
    # fused cache write on the band tiles only
    band_n = (start_m // BLOCK_N) * BLOCK_N
    k_base = KN + q0_64 * stride_kt + kvh.to(tl.int64) * stride_kh
    v_base = VN + q0_64 * stride_vt + kvh.to(tl.int64) * stride_vh
    for start_n in range(0, end_m, BLOCK_N):
        kn = start_n + offs_n
        kok = kn < ql
        k = tl.load(k_base + kn[:, None] * stride_kt + offs_d[None, :], mask=kok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        v = tl.load(v_base + kn[:, None] * stride_vt + offs_d[None, :], mask=kok[:, None], other=0.0)
        if start_n >= band_n:
            qk = tl.where(pos[:, None] >= kn[None, :], qk, float("-inf"))
            own = (kn >= start_m) & (kn < end_m)
            slot = tl.load(SLOT + q0_64 + kn, mask=own, other=0)
            dst = (slot // BS) * stride_cp + (slot % BS) * stride_cs + head_off
            # the copy reads its rows again (L2-hot) instead of reusing k / v: a tile with a second
            # consumer gets a single shared-memory buffer from the sm_90 pipeliner, which then
            # refills it while the asynchronous P.V wgmma still reads it (see the module docstring)
            k_own = tl.load(k_base + kn[:, None] * stride_kt + offs_d[None, :], mask=own[:, None], other=0.0)
            v_own = tl.load(v_base + kn[:, None] * stride_vt + offs_d[None, :], mask=own[:, None], other=0.0)
            tl.store(KC + dst[:, None] + offs_d[None, :], k_own, mask=own[:, None])
            tl.store(VC + dst[:, None] + offs_d[None, :], v_own, mask=own[:, None])
        acc, m_i, l_i = _update(qk, acc, m_i, l_i, v, qk_scale)

    out = acc * (1.0 / l_i)[:, None]
    tl.store(O + (q0_64 + pos[:, None]) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _extend_kernel(Q, KN, VN, KC, VC, O, CU, CTX, BT, SLOT, TREQ, TTILE, qk_scale,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                   stride_cp, stride_cs, stride_ch, stride_bt, BS: tl.constexpr,
                   HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, SMALL_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CTX_STAGES: tl.constexpr):
    """Program ``p``: item ``p // HKV`` of the sorted list, KV head ``p % HKV``. Requests of at
    most ``SMALL_M // GROUP`` new tokens take the small-tile path (one item), the others
    ``BLOCK_M``-row tiles."""
    pid = tl.program_id(0)
    slot = pid // HKV
    kvh = pid % HKV
    req = tl.load(TREQ + slot)
    if req < 0:
        return
    tile = tl.load(TTILE + slot)
    q0 = tl.load(CU + req)
    ql = tl.load(CU + req + 1) - q0
    ctx = tl.load(CTX + req)
    if ql <= SMALL_M // GROUP:
        _attend(Q, KN, VN, KC, VC, O, BT, SLOT, qk_scale, q0, ql, ctx, req, kvh, 0,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                stride_cp, stride_cs, stride_ch, stride_bt, BS,
                GROUP=GROUP, HEAD_DIM=HEAD_DIM, BM=SMALL_M, BLOCK_N=BLOCK_N, CTX_STAGES=CTX_STAGES)
    else:
        _attend(Q, KN, VN, KC, VC, O, BT, SLOT, qk_scale, q0, ql, ctx, req, kvh, tile * (BLOCK_M // GROUP),
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                stride_cp, stride_cs, stride_ch, stride_bt, BS,
                GROUP=GROUP, HEAD_DIM=HEAD_DIM, BM=BLOCK_M, BLOCK_N=BLOCK_N, CTX_STAGES=CTX_STAGES)


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Extend attention over a paged prefix with the fused cache write.

    Args:
        q: ``[T, Hq, D]`` bf16/fp16, unit stride on D.
        k_new, v_new: ``[T, Hkv, D]``, q's dtype; written into the cache at ``slot_mapping``.
        cu_seqlens_q: ``[N + 1]`` int32 device offsets of the chunks (never read on the host).
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` NHD pages, unit stride on D (updated in place).
        block_tables: ``[N, MAXB]`` int32; context_lens: ``[N]`` int32; slot_mapping: ``[T]`` int64.
        max_seqlen_q, max_context_len: host bounds (unused: the launch is sized from shapes).
        scale: softmax scale.

    Returns:
        ``o [T, Hq, D]`` in q's dtype.

    Raises:
        ValueError: inconsistent shapes, a head dim that is not a power of two in [16, 256], or a
            GQA group too large for the tiles.
    """
    T, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    N = cu_seqlens_q.shape[0] - 1
    if Hq % Hkv or k_new.shape != (T, Hkv, D) or v_new.shape != k_new.shape or v_cache.shape != k_cache.shape:
        raise ValueError(f"bad shapes q {tuple(q.shape)} k_new {tuple(k_new.shape)} k_cache {tuple(k_cache.shape)}")
    if D not in (16, 32, 64, 128, 256) or any(t.stride(-1) != 1 for t in (q, k_new, v_new, k_cache, v_cache)):
        raise ValueError("head dim must be a power of two in [16, 256] with unit stride")
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share their strides")
    G = Hq // Hkv
    cfg = tile_config(D, G)
    P = cfg["BLOCK_M"] // G
    n_slots = triton.cdiv(T, P) + N           # >= the item count for any lengths summing to T
    o = torch.empty_like(q)
    work = torch.empty((5, n_slots), device=q.device, dtype=torch.int32)
    _count_kernel[(1,)](cu_seqlens_q, context_lens, work[0], work[1], work[2], N, n_slots,
                        P=P, SMALL_Q=cfg["SMALL_M"] // G, RB=COUNT_BLOCK, num_warps=4)
    _rank_kernel[(triton.cdiv(n_slots, RANK_ROWS),)](work[0], work[1], work[2], work[3], work[4], n_slots,
                                                     ROWS=RANK_ROWS, COLS=RANK_COLS, num_warps=4)
    _extend_kernel[(n_slots * Hkv,)](
        q, k_new, v_new, k_cache, v_cache, o, cu_seqlens_q, context_lens, block_tables, slot_mapping,
        work[3], work[4], scale * LOG2E,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        o.stride(0), o.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        BS=BS, HKV=Hkv, GROUP=G, HEAD_DIM=D, BLOCK_M=cfg["BLOCK_M"], SMALL_M=cfg["SMALL_M"], BLOCK_N=cfg["BLOCK_N"],
        CTX_STAGES=cfg["CTX_STAGES"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return o
