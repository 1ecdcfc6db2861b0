"""Expert Triton solution: MoE align-block-size as a one-launch counting sort.

Contract (identical to ``reference.run``)
------------------------------------------
``run(topk_ids, block_size, num_experts)``: ``topk_ids [T, k]`` int32 (values in ``[0, E)``)
-> ``(sorted_token_ids [n + E (B-1)] int32, expert_ids [ceil((n + E (B-1)) / B)] int32,
num_tokens_post_padded [1] int32)`` with ``n = T k``, ``E = num_experts``, ``B = block_size``.
Expert ``e``'s segment of ``sorted_token_ids`` (in expert order, length ``ceil(count_e/B) B``)
holds its assignments ``t k + j`` in any order and the sentinel ``n`` in its padding slots.

Design
------
L1 -- counting sort, not a comparison sort.
    Histogram the ``n`` expert ids (``E`` buckets), exclusive-scan the *padded* counts to get
    each segment's start, then scatter every assignment to ``start[e] + (its rank among e's
    assignments)``.  O(n) work; the order inside a segment is free, so ranks come from
    atomic cursors and no stable order is maintained.  Only the ``<= E (B-1)`` padding slots
    get the sentinel (no memset of the whole output); the output sizes are static upper
    bounds, so nothing depends on the host (CUDA-graph safe).

L2 -- one launch, counts on chip, phases separated by a grid barrier.
    ``P`` programs (at most one per SM, so that all are resident) each own a contiguous
    slice of the ids.  Phase 1: a program histograms its slice in registers
    (``tl.histogram``) and adds the histogram to the global per-expert counts with ONE vector
    atomic (E adds per program instead of one per id).  A grid barrier (arrival counter plus
    spin) separates the phases.  Phase 2: every program reads the E counts, scans the padded
    counts in registers (redundantly: cheaper than another launch), program 0 writes
    ``num_tokens_post_padded``, the programs share the ``expert_ids`` blocks and the padding
    slots, and each scatters its own slice (re-read from L2).  At decode sizes (``n <=``
    :data:`SINGLE_MAX`) one program does everything: no barrier, no workspace memset.
    Without the grid barrier (:data:`GRID_SYNC` off, or the CPU interpreter, which runs
    programs one after the other) the same kernel runs as two launches (phase 1, phase 2).

L3 -- aggregated atomics for the ranks.
    The scatter takes ``NSUB x SUB`` ids at a time.  Inside each ``SUB``-wide sub-tile a
    ``SUB x SUB`` equality matrix gives every id its rank among equal ids and the group size;
    only the first id of each group (the leader) does ``old = atomic_add(cursor[e], size)``,
    and the others take the leader's ``old`` from the same matrix.  This divides the atomic
    traffic on hot experts by the group size (Mixtral's 8 experts: ~8x), and all sub-tiles of
    a step issue their atomics together, so one L2 round trip covers ``NSUB x SUB`` ids.
    int32 everywhere; the barrier has a spin bound so that a failure cannot hang the GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: One launch with a grid-wide barrier between the phases (off: two launches).
GRID_SYNC = True
#: Up to this many assignments one program does everything (decode batches).
SINGLE_MAX = 1024
#: Scatter step: NSUB sub-tiles of SUB ids (the equality matrices are SUB x SUB).
SUB = 32
NSUB = 4 if _INTERPRET else 16
#: Ids per histogram step in phase 1.
COUNT_TILE = 256 if _INTERPRET else 1024
#: Programs' slices are multiples of this many ids.
SLICE_QUANTUM = 64 if _INTERPRET else 512
#: Bound of the barrier's spin loop (a safety valve; it is never reached when all programs run).
MAX_SPIN = 1 << 22
NUM_WARPS = 8
#: Fewest expert bins (padding experts receive nothing; see align()).
MIN_E_PAD = 32

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
                  n, chunk, num_experts, block_size,
                  E_PAD: tl.constexpr, COUNT_TILE: tl.constexpr, NSUB: tl.constexpr, SUB: tl.constexpr,
                  PAD_E: tl.constexpr, PAD_B: tl.constexpr, EID_TILE: tl.constexpr,
                  PHASE: tl.constexpr, SINGLE: tl.constexpr, MAX_SPIN: tl.constexpr):
    """Counting sort of ``n`` expert ids with block padding.

    PHASE 0: both phases in one launch (grid barrier unless SINGLE); 1: counts only; 2: scan
    and scatter only.  ``ws_ptr`` int32 workspace: counts[E_PAD] | cursors[E_PAD] | barrier[1],
    zero-initialised by the caller unless SINGLE (then only the cursors are used, and this
    program initialises them).  Program ``p`` owns ids ``[p*chunk, min((p+1)*chunk, n))``.
    """
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lo = pid * chunk
    hi = tl.minimum(lo + chunk, n)
    ex = tl.arange(0, E_PAD)
    cursor_ptr = ws_ptr + E_PAD

    # ---- phase 1: per-program histogram in registers, one vector atomic into the counts
    if PHASE != 2:
        hist = tl.zeros([E_PAD], dtype=tl.int32)
        for start in range(lo, hi, COUNT_TILE):
            offs = start + tl.arange(0, COUNT_TILE)
            e = tl.load(ids_ptr + offs, mask=offs < hi, other=0)
            hist += tl.histogram(e, E_PAD)
        masked = tl.cdiv(hi - lo, COUNT_TILE) * COUNT_TILE - (hi - lo)  # masked lanes landed in bin 0
        hist -= tl.where(ex == 0, masked, 0)
        if not SINGLE:
            tl.atomic_add(ws_ptr + ex, hist, mask=hist > 0)
    if PHASE == 0 and not SINGLE:  # grid barrier: every program's counts are in
        tl.debug_barrier()
        arrived = tl.atomic_add(ws_ptr + 2 * E_PAD, 1) + 1
        spins = arrived * 0  # an int32 scalar like `arrived` (loop-carried types must not change)
        while (arrived < nprog) & (spins < MAX_SPIN):
            arrived = tl.atomic_add(ws_ptr + 2 * E_PAD, 0)
            spins += 1
        tl.debug_barrier()

    # ---- phase 2: scan of the padded counts (each program, redundantly), then scatter
    if PHASE != 1:
        if SINGLE:
            counts = hist
            tl.atomic_xchg(cursor_ptr + ex, tl.zeros([E_PAD], dtype=tl.int32))
            tl.debug_barrier()
        else:
            counts = tl.load(ws_ptr + ex, volatile=True)
        counts = tl.where(ex < num_experts, counts, 0)
        padded = (counts + block_size - 1) // block_size * block_size
        ends = tl.cumsum(padded, 0)
        starts = ends - padded
        total = tl.sum(padded, 0)
        if pid == 0:
            tl.store(ntpp_ptr, total)
        # expert_ids: the owner of block b is the number of segments ending at or before b*B
        nb = total // block_size
        for b0 in range(pid * EID_TILE, nb, nprog * EID_TILE):
            b = b0 + tl.arange(0, EID_TILE)
            owner = tl.sum((ends[None, :] <= (b * block_size)[:, None]).to(tl.int32), axis=1)
            tl.store(eids_ptr + b, owner, mask=b < nb)
        # sentinel in the padding slots [start + count, start + padded) of each expert
        j = tl.arange(0, PAD_B)
        for e0 in range(pid * PAD_E, num_experts, nprog * PAD_E):
            er = e0 + tl.arange(0, PAD_E)
            er = tl.where(er < num_experts, er, 0)
            st = tl.gather(starts, er, 0)
            slot = st[:, None] + tl.gather(counts, er, 0)[:, None] + j[None, :]
            end = st + tl.gather(padded, er, 0)
            ok = ((e0 + tl.arange(0, PAD_E)) < num_experts)[:, None] & (slot < end[:, None])
            tl.store(sorted_ptr + slot, n, mask=ok)
        # scatter: rank inside SUB-wide sub-tiles, one atomic per (sub-tile, expert) group
        sub = tl.arange(0, SUB)
        before = sub[None, None, :] < sub[None, :, None]          # partner j precedes i
        starts2 = tl.broadcast_to(starts[None, :], (NSUB, E_PAD))
        for start in range(lo, hi, NSUB * SUB):
            offs = start + tl.arange(0, NSUB)[:, None] * SUB + sub[None, :]
            m = offs < hi
            e = tl.load(ids_ptr + offs, mask=m, other=-1)
            eq = (e[:, :, None] == e[:, None, :]) & m[:, None, :]
            rank = tl.sum((eq & before).to(tl.int32), axis=2)
            size = tl.sum(eq.to(tl.int32), axis=2)
            lead = m & (rank == 0)
            es = tl.where(m, e, 0)
            old = tl.atomic_add(cursor_ptr + es, size, mask=lead)
            old = tl.where(lead, old, 0)
            base = tl.sum(tl.where(eq, old[:, None, :], 0), axis=2)
            slot = tl.gather(starts2, es, 1) + base + rank
            tl.store(sorted_ptr + slot, offs, mask=m)


def run(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """Align ``topk_ids [T, k]`` int32 into expert segments padded to ``block_size``.

    Returns ``(sorted_token_ids [n + E (B-1)] int32, expert_ids [ceil((n + E (B-1)) / B)]
    int32, num_tokens_post_padded [1] int32)``; no host synchronisation.
    """
    n = topk_ids.numel()
    if n <= SINGLE_MAX:
        mode = "single"
    else:
        mode = "fused" if GRID_SYNC and not _INTERPRET else "two_phase"
    return align(topk_ids, block_size, num_experts, mode)


def align(topk_ids: torch.Tensor, block_size: int, num_experts: int, mode: str, programs: int | None = None):
    """:func:`run` with an explicit schedule (tests and the GPU script compare them).

    Args:
        mode: ``single`` (one program, no workspace memset), ``fused`` (one launch, grid
            barrier; ``programs`` must not exceed what the GPU runs at once) or ``two_phase``.
        programs: number of programs (default: one per SM, slices of SLICE_QUANTUM ids).
    """
    T, k = topk_ids.shape
    n, E, B = T * k, int(num_experts), int(block_size)
    ids = topk_ids.contiguous()
    dev = ids.device
    length = n + E * (B - 1)
    sorted_ids = torch.empty(length, dtype=torch.int32, device=dev)
    expert_ids = torch.empty((length + B - 1) // B, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    # At least MIN_E_PAD bins: triton 3.6 cannot compile the [NSUB, E_PAD] tl.gather of the scatter
    # when NSUB * E_PAD < the program's threads (assertion `isWarpLocal` in
    # OptimizeThreadLocality; e.g. Mixtral's E = 8 with 8 warps). Bins >= E stay empty.
    E_PAD = max(triton.next_power_of_2(E), MIN_E_PAD)
    single = mode == "single"
    if single:
        chunk, P = max(n, 1), 1
        ws = torch.empty(2 * E_PAD + 1, dtype=torch.int32, device=dev)
    else:
        per = triton.cdiv(n, programs or _num_sms(dev))
        chunk = triton.cdiv(per, SLICE_QUANTUM) * SLICE_QUANTUM
        P = triton.cdiv(n, chunk)
        ws = torch.zeros(2 * E_PAD + 1, dtype=torch.int32, device=dev)
    meta = dict(E_PAD=E_PAD, COUNT_TILE=COUNT_TILE, NSUB=NSUB, SUB=SUB,
                PAD_E=max(2, min(16, 4096 // triton.next_power_of_2(B))), PAD_B=triton.next_power_of_2(B),
                EID_TILE=max(2, min(64, 8192 // E_PAD)), SINGLE=single, MAX_SPIN=MAX_SPIN, num_warps=NUM_WARPS)
    args = (ids, sorted_ids, expert_ids, ntpp, ws, n, chunk, E, B)
    if mode in ("single", "fused"):
        _align_kernel[(P,)](*args, PHASE=0, **meta)
    elif mode == "two_phase":
        _align_kernel[(P,)](*args, PHASE=1, **meta)
        _align_kernel[(P,)](*args, PHASE=2, **meta)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return sorted_ids, expert_ids, ntpp
