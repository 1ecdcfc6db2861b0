"""Expert Triton solution: MoE align-block-size as a one-launch counting sort without per-id atomics.

Contract (identical to ``reference.run``)
------------------------------------------
``run(topk_ids, block_size, num_experts)``: ``topk_ids [T, k]`` int32 (values in ``[0, E)``)
-> ``(sorted_token_ids [n + E (B-1)] int32, expert_ids [ceil((n + E (B-1)) / B)] int32,
num_tokens_post_padded [1] int32)`` with ``n = T k``, ``E = num_experts``, ``B = block_size``.
Expert ``e``'s segment of ``sorted_token_ids`` (in expert order, length ``ceil(count_e/B) B``)
holds its assignments ``t k + j`` in any order and the sentinel ``n`` in its padding slots.

Design
------
L1 -- counting sort, not a comparison sort of the whole input.
    Histogram the ``n`` expert ids (``E`` buckets), exclusive-scan the *padded* counts to get
    each segment's start, then put every assignment at ``start[e] + (its rank among e's
    assignments)``.  Only the ``<= E (B-1)`` padding slots get the sentinel; output sizes are
    static upper bounds, so nothing depends on the host (CUDA-graph safe).

L2 -- one launch, ids read once and kept in registers.
    ``P`` programs (one per SM, all resident) each own a contiguous slice of ``CHUNK`` ids,
    loaded once into registers.  A program histograms its slice (``tl.histogram``) and adds
    the histogram to the global counts with ONE vector atomic whose *returned old values* are
    the program's base offset inside every expert's segment (the programs' ranges inside a
    segment are disjoint; the order inside a segment is free).  The rank of an id among the
    program's ids of the same expert comes from a local sort (below), so the scatter needs no
    per-id global atomic at all (the previous version's ~0.9 atomics per id on a handful of
    hot counter lines were its bottleneck).  Grid barrier: the counts themselves; every add is
    positive and they total ``n``, so once a program reads ``sum(counts) == n`` every count is
    final (no arrival counter, no extra round trip).  Then every program scans the E counts
    (redundantly; cheaper than another launch), writes its share of ``expert_ids`` and of the
    padding, and stores its ids.  At decode sizes (``n <=`` :data:`SINGLE_MAX`) one program
    does everything with no memset and no grid barrier (see L3 for its ranks).

L3 -- in-program ranks from a sort of packed keys, not from atomics.
    ``key = expert << log2(CHUNK) | local index``; ``tl.sort`` (a bitonic network over
    registers, warp shuffles and a few shared-memory exchanges) orders the keys by expert.  The
    id at sorted position ``p`` with expert ``e`` has local rank ``p - lstart[e]`` (``lstart``:
    exclusive scan of the local histogram), so its slot is ``off[e] + p`` with ``off = start +
    program base - lstart`` (one gather from an E-vector).  Consecutive sorted ids of one expert
    go to consecutive slots, so the stores coalesce.  Deterministic apart from the order of the
    programs' base offsets.  For few experts (E_PAD <= :data:`ONEHOT_MAX`) the rank is a
    cumulative sum of the one-hot rows instead, four experts per int64 word (16-bit fields):
    E_PAD / 4 one-dimensional scans, cheaper than the sort.
    Block owners: every expert writes its own blocks (``start/B + j``, ``j < padded/B``), the
    programs share the ``j`` range; the padding slots likewise.
    Decode sizes (one program): a sort of all ``n`` ids on one SM is a long serial chain of
    shared-memory exchanges (the previous single path: ~114 CTA barriers).  There the rank is
    the returned old value of a per-id ``atomic_add`` on E counters the program zeroes itself
    (an uninitialised workspace, no memset node); after a CTA barrier the counters ARE the
    counts, so no histogram either.  ~2k atomics from one SM cost about one L2 round trip
    plus ~1 cycle each of request issue, far less than the sort.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: Up to this many assignments one program does everything (decode batches).
SINGLE_MAX = 2048
#: int32 stride of the single-program path's per-expert counters (1: packed, so a warp's
#: atomics touch at most E/32 lines; the L1 splits a scattered atomic per 128-byte line).
CNT_STRIDE = 1
#: Largest [E_PAD, B] padding tile the single-program path stores in one shot.
SMALL_PAD_TILE = 8192
#: Warps of the single-program path.
SMALL_WARPS = 8
#: Fewest ids per program in the multi-program schedule (a power of two).
MIN_CHUNK = 256
#: Up to this many expert bins the local rank is a one-hot cumulative sum instead of a sort.
ONEHOT_MAX = 16
#: Ids per sorted row (the sort costs log2(ROW)^2 compare-exchange stages per id).
ROW = 256
#: Slices up to this many ids are sorted as one row (R = 1: no per-row histograms).
ROW_FULL = 1024
#: Bound of the barrier's spin loop (a safety valve; it is never reached when all programs run).
MAX_SPIN = 1 << 22
#: Fewest expert bins (padding bins >= E receive nothing).
MIN_E_PAD = 8
#: Elements per program of the 2-D block-owner / padding tiles.
TILE_ELEMS = 4096

_SM_COUNT: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


@triton.jit
def _align_kernel(ids_ptr, sorted_ptr, eids_ptr, ntpp_ptr, ws_ptr,
                  n, num_experts, block_size,
                  E_PAD: tl.constexpr, CHUNK: tl.constexpr, S: tl.constexpr, LOG_S: tl.constexpr,
                  ONEHOT: tl.constexpr, EID_J: tl.constexpr, PAD_J: tl.constexpr,
                  PHASE: tl.constexpr, MAX_SPIN: tl.constexpr):
    """Counting sort of ``n`` expert ids with block padding; program ``p`` owns ids
    ``[p*CHUNK, (p+1)*CHUNK)``.

    PHASE 0: everything in one launch (grid barrier); 1: counts only (stores the program's
    base offsets to the workspace); 2: the rest (a second launch).  ``ws_ptr`` int32
    workspace: counts[E_PAD] | bases[P * E_PAD] (bases only for PHASE 1/2), the counts
    zero-initialised by the caller.  (Decode sizes use :func:`_align_small_kernel`.)
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lo = pid * CHUNK
    ex = tl.arange(0, E_PAD)
    R: tl.constexpr = CHUNK // S
    if ONEHOT or R == 1:
        offs = tl.arange(0, CHUNK)
        m = lo + offs < n
        e = tl.load(ids_ptr + lo + offs, mask=m, other=0)
        hist = tl.histogram(e, E_PAD, mask=m)
    else:
        # the slice as R rows of S ids; each row is histogrammed on its own (for the prefix
        # over rows) and sorted on its own (a row sort costs log2(S)^2 stages, not log2(CHUNK)^2)
        rr = tl.arange(0, R)[:, None]
        cs = tl.arange(0, S)[None, :]
        offs2 = rr * S + cs
        m2 = lo + offs2 < n
        e2 = tl.load(ids_ptr + lo + offs2, mask=m2, other=0)
        # pre[r, e] = (ids of expert e in rows < r) - (ids of experts < e in row r)
        hist = tl.zeros([E_PAD], dtype=tl.int32)
        pre = tl.zeros([R, E_PAD], dtype=tl.int32)
        for r in tl.static_range(R):
            o = lo + r * S + tl.arange(0, S)
            h = tl.histogram(tl.load(ids_ptr + o, mask=o < n, other=0), E_PAD, mask=o < n)
            pre = tl.where(rr == r, (hist - (tl.cumsum(h, 0) - h))[None, :], pre)
            hist += h

    # ---- program base inside every expert's segment: old value of the vector atomic
    if PHASE == 2:
        base = tl.load(ws_ptr + E_PAD * (1 + pid) + ex)
    else:
        old = tl.atomic_add(ws_ptr + ex, hist, mask=hist > 0)
        base = tl.where(hist > 0, old, 0)
        if PHASE == 1:
            tl.store(ws_ptr + E_PAD * (1 + pid) + ex, base)

    if PHASE != 1:
        # ---- local ranks (independent of the other programs: computed before the barrier)
        if ONEHOT:
            # rank = number of earlier ids of the same expert: cumulative sum of the one-hot rows
            # (4 experts per int64 word, 16-bit fields: E_PAD / 4 one-dimensional scans)
            sh = ((e % 4) * 16).to(tl.int64)
            one = tl.where(m, tl.full([CHUNK], 1, tl.int64) << sh, 0)
            rank = tl.zeros([CHUNK], dtype=tl.int32)
            for w in tl.static_range(E_PAD // 4):
                cum = tl.cumsum(tl.where(e // 4 == w, one, 0), 0)
                rank = tl.where(e // 4 == w, ((cum >> sh) & 0xFFFF).to(tl.int32) - 1, rank)
        elif R == 1:
            skey1 = tl.sort((tl.where(m, e, E_PAD) << LOG_S) | offs)
            se1 = skey1 >> LOG_S
            # sorted position p of an id of expert e: local rank p - (ids of experts < e)
            lstart = tl.cumsum(hist, 0) - hist
        else:
            skey = tl.sort((tl.where(m2, e2, E_PAD) << LOG_S) | cs)
            se = skey >> LOG_S
            val = lo + rr * S + (skey & (S - 1))

        # ---- grid barrier: wait until every program's counts are in
        counts = tl.load(ws_ptr + ex, volatile=True)
        if PHASE == 0:
            spins = pid * 0
            while (tl.sum(counts, 0) < n) & (spins < MAX_SPIN):
                counts = tl.load(ws_ptr + ex, volatile=True)
                spins += 1

        # ---- scan of the padded counts (every program, redundantly)
        counts = tl.where(ex < num_experts, counts, 0)
        padded = (counts + block_size - 1) // block_size * block_size
        ends = tl.cumsum(padded, 0)
        starts = ends - padded
        if pid == 0:
            tl.store(ntpp_ptr, tl.sum(padded, 0))

        # ---- scatter: slot = start[e] + program base[e] + rank among the program's ids of e
        off = starts + base
        if ONEHOT:
            slot = tl.gather(off, tl.where(m, e, 0), 0) + rank
            tl.store(sorted_ptr + slot, lo + offs, mask=m)
        elif R == 1:
            valid1 = se1 < E_PAD
            slot = tl.gather(off - lstart, tl.where(valid1, se1, 0), 0) + offs
            tl.store(sorted_ptr + slot, lo + (skey1 & (CHUNK - 1)), mask=valid1)
        else:
            valid = se < E_PAD
            slot = tl.gather(off[None, :] + pre, tl.where(valid, se, 0), 1) + cs
            tl.store(sorted_ptr + slot, val, mask=valid)

        # ---- expert_ids: expert e owns blocks start[e]/B + j, j < padded[e]/B (programs share j)
        nblk = padded // block_size
        sblk = starts // block_size
        maxb = tl.max(nblk, 0)
        jj = tl.arange(0, EID_J)
        for j0 in range(pid * EID_J, maxb, nprog * EID_J):
            j = j0 + jj
            tl.store(eids_ptr + sblk[:, None] + j[None, :], tl.broadcast_to(ex[:, None], (E_PAD, EID_J)),
                     mask=j[None, :] < nblk[:, None])
        # ---- sentinel in the padding slots [start + count, start + padded) (programs share j)
        npad = padded - counts
        first = starts + counts
        maxp = tl.max(npad, 0)
        pj = tl.arange(0, PAD_J)
        for j0 in range(pid * PAD_J, maxp, nprog * PAD_J):
            j = j0 + pj
            tl.store(sorted_ptr + first[:, None] + j[None, :], n, mask=j[None, :] < npad[:, None])


@triton.jit
def _align_small_kernel(ids_ptr, sorted_ptr, eids_ptr, ntpp_ptr, cnt_ptr,
                        n, num_experts, block_size,
                        E_PAD: tl.constexpr, N_PAD: tl.constexpr, STRIDE: tl.constexpr,
                        PAD_J: tl.constexpr, PAD_ONE: tl.constexpr):
    """Decode sizes: ONE program (one CTA) aligns all ``n <= N_PAD`` ids.

    Ranks come from per-id atomics on E counters that this program zeroes itself
    (``cnt_ptr``: an uninitialised int32 workspace of ``E_PAD * STRIDE``; counter ``e`` at
    ``e * STRIDE``); the counters' final values are the counts.  Dependent chain: ids load ->
    atomics -> CTA barrier -> counts load -> scan -> gather -> stores; no sort, no histogram,
    no memset, no second launch, no per-expert loops (block owners are written per id).  The CTA barriers (``bar.sync``) order the zero stores before the
    atomics and the atomics before the count read-back (PTX: memory accesses requested before
    a barrier are performed relative to every thread of the CTA).
    """
    offs = tl.arange(0, N_PAD)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    ex = tl.arange(0, E_PAD)
    tl.store(cnt_ptr + ex * STRIDE, tl.zeros([E_PAD], dtype=tl.int32))
    tl.debug_barrier()
    # rank of every id among the ids of its expert (any order inside a segment is valid)
    rank = tl.atomic_add(cnt_ptr + e * STRIDE, 1, mask=m, sem="relaxed")
    tl.debug_barrier()
    counts = tl.load(cnt_ptr + ex * STRIDE, volatile=True)

    counts = tl.where(ex < num_experts, counts, 0)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    # the total is the last inclusive end (a masked store: no cross-warp reduction)
    tl.store(ntpp_ptr + ex * 0, ends, mask=ex == E_PAD - 1)
    slot = tl.gather(starts, e, 0) + rank
    tl.store(sorted_ptr + slot, offs, mask=m)
    # expert_ids: block j of expert e starts at slot start[e] + j B, which holds the id of rank
    # j B (j B < count); that id names the block's owner (no per-expert loop, no max)
    first_in_blk = m & (rank % block_size == 0)
    tl.store(eids_ptr + slot // block_size, e, mask=first_in_blk)
    # sentinel in the padding slots [start + count, start + padded): fewer than B per expert
    npad = padded - counts
    first = starts + counts
    pj = tl.arange(0, PAD_J)
    if PAD_ONE:
        tl.store(sorted_ptr + first[:, None] + pj[None, :], n, mask=pj[None, :] < npad[:, None])
    else:
        for j0 in range(0, tl.max(npad, 0), PAD_J):
            j = j0 + pj
            tl.store(sorted_ptr + first[:, None] + j[None, :], n, mask=j[None, :] < npad[:, None])


def run(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """Align ``topk_ids [T, k]`` int32 into expert segments padded to ``block_size``.

    Returns ``(sorted_token_ids [n + E (B-1)] int32, expert_ids [ceil((n + E (B-1)) / B)]
    int32, num_tokens_post_padded [1] int32)``; no host synchronisation.
    """
    n = topk_ids.numel()
    if n <= SINGLE_MAX:
        mode = "single"
    else:
        mode = "two_phase" if _INTERPRET else "fused"
    return align(topk_ids, block_size, num_experts, mode)


def align(topk_ids: torch.Tensor, block_size: int, num_experts: int, mode: str, programs: int | None = None):
    """:func:`run` with an explicit schedule (tests and the GPU script compare them).

    Args:
        mode: ``single`` (one program, per-id atomics on self-zeroed counters), ``fused`` (one launch, grid barrier;
            ``programs`` must not exceed what the GPU runs at once) or ``two_phase``.
        programs: number of programs (default: one per SM).
    """
    T, k = topk_ids.shape
    n, E, B = T * k, int(num_experts), int(block_size)
    ids = topk_ids.contiguous()
    dev = ids.device
    length = n + E * (B - 1)
    sorted_ids = torch.empty(length, dtype=torch.int32, device=dev)
    expert_ids = torch.empty((length + B - 1) // B, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    E_PAD = max(triton.next_power_of_2(E), MIN_E_PAD)
    per = max(1, TILE_ELEMS // E_PAD)
    B2 = triton.next_power_of_2(B)
    args = (ids, sorted_ids, expert_ids, ntpp)
    if mode == "single":
        # one program; counters in an uninitialised workspace that the kernel zeroes itself
        cnt = torch.empty(E_PAD * CNT_STRIDE, dtype=torch.int32, device=dev)
        n_pad = triton.next_power_of_2(max(n, 1))
        pad_j = max(1, min(max(per, SMALL_PAD_TILE // E_PAD), B2))  # one shot when E_PAD B2 is small
        _align_small_kernel[(1,)](*args, cnt, n, E, B, E_PAD=E_PAD, N_PAD=n_pad, STRIDE=CNT_STRIDE,
                                  PAD_J=pad_j, PAD_ONE=pad_j >= B2, num_warps=SMALL_WARPS)
        return sorted_ids, expert_ids, ntpp
    chunk = max(triton.next_power_of_2(triton.cdiv(n, programs or _num_sms(dev))), MIN_CHUNK)
    P = triton.cdiv(n, chunk)
    ws = torch.zeros(E_PAD * (1 + (P if mode == "two_phase" else 0)), dtype=torch.int32, device=dev)
    # block owners: at most ceil(max count / B) + 1 blocks per expert; padding: < B slots per expert
    eid_j = max(1, min(per, triton.next_power_of_2(triton.cdiv(triton.cdiv(n, B) + 1, P))))
    pad_j = max(1, min(per, triton.next_power_of_2(triton.cdiv(B2, P))))
    onehot = E_PAD <= ONEHOT_MAX
    row = chunk if chunk <= ROW_FULL else ROW
    meta = dict(E_PAD=E_PAD, CHUNK=chunk, S=row, LOG_S=row.bit_length() - 1, ONEHOT=onehot,
                EID_J=eid_j, PAD_J=pad_j, MAX_SPIN=MAX_SPIN, num_warps=8)
    args = (*args, ws, n, E, B)
    if mode == "fused":
        _align_kernel[(P,)](*args, PHASE=0, **meta)
    elif mode == "two_phase":
        _align_kernel[(P,)](*args, PHASE=1, **meta)
        _align_kernel[(P,)](*args, PHASE=2, **meta)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return sorted_ids, expert_ids, ntpp
