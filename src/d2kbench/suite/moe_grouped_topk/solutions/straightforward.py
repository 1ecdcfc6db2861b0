"""Grouped top-k routing, straightforward Triton port (no expert design).

A competent direct translation of the PyTorch semantics: one program per token row, the row
in a [G, E/G] register tile; the two best choice scores of every group by max, argmax and a
second max; ``topk_group`` rounds of argmax over the group scores; ``k`` rounds of argmax over
the masked row, each followed by a sum that extracts the chosen expert's unbiased score; the
weights renormalised and scaled at the end. Default launch shape (4 warps per row).

Shapes: ``router_logits [T, E]`` fp32, ``e_score_correction_bias [E]`` fp32 ->
``(topk_weights [T, k] fp32, topk_ids [T, k] int32)``. One launch, no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_topk_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, scale,
                     E: tl.constexpr, G: tl.constexpr, GSZ: tl.constexpr, G_PAD: tl.constexpr,
                     GSZ_PAD: tl.constexpr, TOPK_GROUP: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, GSZ_PAD)
    expert = g[:, None] * GSZ + j[None, :]
    emask = (g < G)[:, None] & (j < GSZ)[None, :]
    x = tl.load(logits_ptr + row * E + expert, mask=emask, other=0.0)
    s = tl.sigmoid(x)
    c = tl.where(emask, s + tl.load(bias_ptr + expert, mask=emask, other=0.0), float("-inf"))
    if G > 1:
        top1 = tl.max(c, axis=1)
        arg1 = tl.argmax(c, axis=1)
        top2 = tl.max(tl.where(j[None, :] == arg1[:, None], float("-inf"), c), axis=1)
        gs = tl.where(g < G, top1 + top2, float("-inf"))
        keep = g < 0
        for r in tl.static_range(TOPK_GROUP):
            gbest = tl.argmax(gs, axis=0)
            keep = keep | (g == gbest)
            gs = tl.where(g == gbest, float("-inf"), gs)
        c = tl.where(keep[:, None], c, float("-inf"))
    flat_c = tl.reshape(c, [G_PAD * GSZ_PAD])
    flat_s = tl.reshape(s, [G_PAD * GSZ_PAD])
    pos = tl.arange(0, G_PAD * GSZ_PAD)
    kk = tl.arange(0, K_PAD)
    sel = tl.zeros([K_PAD], dtype=tl.float32)
    ids = tl.zeros([K_PAD], dtype=tl.int32)
    for r in tl.static_range(K):
        i = tl.argmax(flat_c, axis=0)
        sel = tl.where(kk == r, tl.sum(tl.where(pos == i, flat_s, 0.0), axis=0), sel)
        ids = tl.where(kk == r, (i // GSZ_PAD) * GSZ + i % GSZ_PAD, ids)
        flat_c = tl.where(pos == i, float("-inf"), flat_c)
    w = sel / tl.sum(sel, axis=0) * scale
    tl.store(ids_ptr + row * K + kk, ids, mask=kk < K)
    tl.store(w_ptr + row * K + kk, w, mask=kk < K)


def run(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor, top_k: int,
        num_expert_group: int, topk_group: int, routed_scaling_factor: float):
    """Grouped top-k routing (see the module docstring for shapes)."""
    logits = router_logits.contiguous()
    bias = e_score_correction_bias.contiguous()
    T, E = logits.shape
    G, k = int(num_expert_group), int(top_k)
    w = torch.empty((T, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, k), dtype=torch.int32, device=logits.device)
    _row_topk_kernel[(T,)](logits, bias, w, ids, float(routed_scaling_factor), E=E, G=G, GSZ=E // G,
                           G_PAD=triton.next_power_of_2(G), GSZ_PAD=triton.next_power_of_2(E // G),
                           TOPK_GROUP=int(topk_group), K=k, K_PAD=triton.next_power_of_2(k), num_warps=4)
    return w, ids
