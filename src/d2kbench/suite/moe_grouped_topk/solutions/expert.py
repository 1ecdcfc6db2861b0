"""Expert Triton solution: DeepSeek-V3 / Kimi-K2 grouped top-k routing in one launch.

Contract (identical to ``reference.run``)
------------------------------------------
``run(router_logits [T, E] fp32, e_score_correction_bias [E] fp32, top_k, num_expert_group,
topk_group, routed_scaling_factor)`` -> ``(topk_weights [T, k] fp32, topk_ids [T, k] int32)``:
``s = sigmoid(L)``, ``c = s + b``; the ``topk_group`` groups with the largest sum of their two
best ``c`` survive; the ``k`` best ``c`` among the surviving experts are chosen; their unbiased
``s`` are renormalised to sum 1 and scaled.

Design
------
L1 -- selection on a tiny row, no sort.
    A row holds at most a few hundred scores and only k + 2 per group of them matter, so the
    operator is a handful of max-selections, never a sort: the two best choice scores of every
    group, a rank of the (at most 8) group scores, then k rounds of "take the best surviving
    expert" over the masked row. Dropped groups are masked to the smallest key (a choice score
    can be negative: masking to 0 would let a dropped expert win). The bias enters only the
    choice; the weights are the unbiased sigmoid scores of the chosen ids, renormalised after
    the selection.

L2 -- everything in registers, many rows per program.
    A program owns BT rows as a [BT, G, E/G] register tile: the logits are read once
    (coalesced, 16-byte vectors), the bias once per program, the sigmoid computed once, and
    each row lives inside one warp, so every reduction is a warp shuffle tree with no shared
    memory and no barrier. The group stage reduces along the group's own axis (fewer shuffle
    levels than a whole-row reduction). Each row writes k ids and k weights, one contiguous
    store per output.

L3 -- one reduction per selection round.
    Each choice score is packed with its expert index into one 64-bit key: the FP32 bits mapped
    to a monotonic integer in the high half, the inverted index in the low half, so a single
    integer max yields both the best score and its (lowest, on ties) index, and removing it is
    one compare against that unique key. The group selection is a rank by pairwise comparison
    of the G group scores (one G x G compare and one sum, instead of topk_group rounds of
    max + argmax). The weights re-read the k chosen logits (L1-resident) and recompute their
    sigmoid with the same formula, so they are bit-identical to the selection's scores without
    a per-round reduction over the row. Rows per program and warps are autotuned for sm_90;
    the call is one launch with no host synchronisation (CUDA-graph timed).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: Smaller than every valid key (the key of -inf is about -0.998 * 2**63).
NEG_KEY: tl.constexpr = tl.constexpr(-(2**63))

_CONFIGS = [triton.Config({"BT": bt}, num_warps=w, num_stages=1)
            for bt, w in ((1, 1), (2, 1), (4, 1), (4, 2), (8, 2), (8, 4), (16, 4))]


@triton.jit
def _to_key(c, slot, BASE: tl.constexpr):
    """(FP32 score, slot index) -> int64 key ordered by score, then by lower slot."""
    bits = c.to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (BASE - 1 - slot).to(tl.int64)


@triton.jit
def _key_score(key):
    """The FP32 score held in the high half of a key."""
    hi = (key >> 32).to(tl.int32)
    return (hi ^ ((hi >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _grouped_topk_body(logits_ptr, bias_ptr, w_ptr, ids_ptr, T, scale,
                       E: tl.constexpr, G: tl.constexpr, GSZ: tl.constexpr, G_PAD: tl.constexpr,
                       GSZ_PAD: tl.constexpr, TOPK_GROUP: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr,
                       BT: tl.constexpr):
    BASE: tl.constexpr = G_PAD * GSZ_PAD
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    rmask = rows < T
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, GSZ_PAD)
    slot = g[:, None] * GSZ_PAD + j[None, :]                      # [G_PAD, GSZ_PAD]
    expert = g[:, None] * GSZ + j[None, :]
    emask = (g < G)[:, None] & (j < GSZ)[None, :]
    valid = rmask[:, None, None] & emask[None, :, :]
    row_off = rows.to(tl.int64) * E
    x = tl.load(logits_ptr + row_off[:, None, None] + expert[None, :, :], mask=valid, other=0.0)
    b = tl.load(bias_ptr + expert, mask=emask, other=0.0)
    c = tl.sigmoid(x) + b[None, :, :]
    key = tl.where(valid, _to_key(c, slot[None, :, :], BASE), NEG_KEY)
    if G > 1:
        # group score = best + second best choice score of the group (two key maxima)
        k1 = tl.max(key, axis=2)
        k2 = tl.max(tl.where(key == k1[:, :, None], NEG_KEY, key), axis=2)
        gs = _key_score(k1) + _key_score(k2)
        gs = tl.where((g < G)[None, :], gs, float("-inf"))
        # rank of every group among the G group scores (ties: lower group first)
        gi = gs[:, :, None]
        gj = gs[:, None, :]
        beats = (gj > gi) | ((gj == gi) & (g[None, None, :] < g[None, :, None]))
        rank = tl.sum(beats.to(tl.int32), axis=2)
        key = tl.where((rank < TOPK_GROUP)[:, :, None], key, NEG_KEY)
    kk = tl.arange(0, K_PAD)
    ids = tl.zeros([BT, K_PAD], dtype=tl.int32)
    for r in tl.static_range(K):
        m = tl.max(tl.max(key, axis=2), axis=1)                   # best surviving key per row
        best = BASE - 1 - m.to(tl.int32)                          # its slot (low half)
        ids = tl.where(kk[None, :] == r, ((best // GSZ_PAD) * GSZ + best % GSZ_PAD)[:, None], ids)
        key = tl.where(key == m[:, None, None], NEG_KEY, key)
    omask = rmask[:, None] & (kk < K)[None, :]
    xs = tl.load(logits_ptr + row_off[:, None] + ids, mask=omask, other=0.0)
    sel = tl.where(omask, tl.sigmoid(xs), 0.0)
    den = tl.where(rmask, tl.sum(sel, axis=1), 1.0)
    w = sel / den[:, None] * scale
    out = rows.to(tl.int64)[:, None] * K + kk[None, :]
    tl.store(ids_ptr + out, ids, mask=omask)
    tl.store(w_ptr + out, w, mask=omask)


_grouped_topk_tuned = triton.autotune(configs=_CONFIGS, key=["T", "E", "G", "K"])(_grouped_topk_body)


def run(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor, top_k: int,
        num_expert_group: int, topk_group: int, routed_scaling_factor: float):
    """Grouped top-k routing: ``router_logits [T, E]`` fp32, ``e_score_correction_bias [E]`` fp32
    -> ``(topk_weights [T, k] fp32, topk_ids [T, k] int32)`` (one launch, no host sync)."""
    logits = router_logits.contiguous()
    bias = e_score_correction_bias.contiguous()
    T, E = logits.shape
    G, k = int(num_expert_group), int(top_k)
    gsz = E // G
    w = torch.empty((T, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, k), dtype=torch.int32, device=logits.device)
    meta = dict(E=E, G=G, GSZ=gsz, G_PAD=triton.next_power_of_2(G), GSZ_PAD=triton.next_power_of_2(gsz),
                TOPK_GROUP=int(topk_group), K=k, K_PAD=triton.next_power_of_2(k))
    if _INTERPRET:
        bt = 4
        _grouped_topk_body[(triton.cdiv(T, bt),)](logits, bias, w, ids, T, float(routed_scaling_factor),
                                                  BT=bt, num_warps=1, **meta)
    else:
        grid = lambda m: (triton.cdiv(T, m["BT"]),)  # noqa: E731
        _grouped_topk_tuned[grid](logits, bias, w, ids, T, float(routed_scaling_factor), **meta)
    return w, ids
