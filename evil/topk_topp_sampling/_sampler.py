"""Shared helper of the evil top-k / top-p samplers (not a solution itself: names starting with
``_`` are skipped by the evil-suite runner).

An *honest* one-kernel Triton sampler for the small smoke vocabularies (one program per
request, the whole row in one tile): top-k by counting the strictly larger scaled logits
(ties at the k-th value kept), top-p by the mass of the strictly larger kept tokens, then the
inverse CDF of the request's uniform in vocabulary order. Pairwise comparisons, ``[V, 32]``
tiles at a time: cheap under ``TRITON_INTERPRET=1`` at V <= 1024 and compilable for the GPU,
useless on a real vocabulary. Each evil file is honest in
everything but its one trick. Knobs a trick turns: ``temperature`` clamped to ``t_range``,
top-p ignored, and a per-request memo in device memory (``memo``: a table of ``MEMO_SLOTS``
(uniform, id) pairs per request, the slot picked by the uniform's low bits, so that every input
set of a timing loop or a CUDA graph keeps its own entry; a request whose uniform is
bit-identical to its slot's gets the remembered id without its row being read).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sample_kernel(x_ptr, t_ptr, k_ptr, p_ptr, u_ptr, ids_ptr, memo_u_ptr, memo_ids_ptr, B, V, t_lo, t_hi,
                   USE_P: tl.constexpr, MEMO: tl.constexpr, SLOTS: tl.constexpr, BLOCK: tl.constexpr,
                   CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    u = tl.load(u_ptr + row)
    entry = (u.to(tl.int32, bitcast=True) & (SLOTS - 1)).to(tl.int64) * B + row
    hit = False
    if MEMO:
        hit = tl.load(memo_u_ptr + entry) == u                 # the same draw as before: "the same sample"
    if hit:
        tl.store(ids_ptr + row, tl.load(memo_ids_ptr + entry))
    else:
        offs = tl.arange(0, BLOCK)
        t = tl.minimum(tl.maximum(tl.load(t_ptr + row), t_lo), t_hi)
        z = tl.load(x_ptr + row * V + offs, mask=offs < V, other=float("-inf")) / t
        n_larger = tl.zeros([BLOCK], dtype=tl.int32)
        for j0 in range(0, V, CHUNK):                          # [BLOCK, CHUNK] pairs at a time
            cols = j0 + tl.arange(0, CHUNK)
            zj = tl.load(x_ptr + row * V + cols, mask=cols < V, other=float("-inf")) / t
            n_larger += tl.sum((zj[None, :] > z[:, None]).to(tl.int32), axis=1)
        keep = (n_larger < tl.load(k_ptr + row)) & (z > float("-inf"))
        zmax = tl.max(z, axis=0)
        w = tl.where(keep, tl.exp(z - zmax), 0.0)
        if USE_P:
            p = tl.load(p_ptr + row)
            kth = tl.min(tl.where(keep, z, float("inf")), axis=0)
            total = tl.sum(w, axis=0)
            above = tl.zeros([BLOCK], dtype=tl.float32)            # top-k mass strictly above each token
            for j0 in range(0, V, CHUNK):
                cols = j0 + tl.arange(0, CHUNK)
                zj = tl.load(x_ptr + row * V + cols, mask=cols < V, other=float("-inf")) / t
                qj = tl.where((zj >= kth) & (zj > float("-inf")), tl.exp(zj - zmax), 0.0) / total
                above += tl.sum(tl.where(zj[None, :] > z[:, None], qj[None, :], 0.0), axis=1)
            keep = keep & (above < tl.where(p >= 1.0, float("inf"), p))     # p = 1 keeps every token
            w = tl.where(keep, w, 0.0)
        cum = tl.cumsum(w, axis=0)
        pick = tl.sum((cum <= u * tl.sum(w, axis=0)).to(tl.int32), axis=0)
        last = tl.max(tl.where(keep, offs, -1), axis=0)
        ids = tl.minimum(pick, last).to(tl.int64)
        tl.store(ids_ptr + row, ids)
        if MEMO:
            tl.store(memo_u_ptr + entry, u)
            tl.store(memo_ids_ptr + entry, ids)


MEMO_SLOTS = 64
_memo: dict = {}


def sample(logits, temperature, top_k, top_p, uniforms, use_p: bool = True, t_range=(0.0, float("inf")),
           memo: bool = False) -> torch.Tensor:
    """ids [B] int64 of the task's sampler (reference.run's contract), with the trick's knobs."""
    B, V = logits.shape
    ids = torch.empty(B, dtype=torch.int64, device=logits.device)
    if memo:
        if _memo.get("B") != B:                                 # device buffers kept across calls
            _memo.update(B=B, u=torch.full((MEMO_SLOTS, B), -1.0, device=logits.device),
                         ids=torch.zeros((MEMO_SLOTS, B), dtype=torch.int64, device=logits.device))
        memo_u, memo_ids = _memo["u"], _memo["ids"]
    else:
        memo_u, memo_ids = uniforms, ids
    _sample_kernel[(B,)](logits, temperature, top_k, top_p, uniforms, ids, memo_u, memo_ids, B, V,
                         float(t_range[0]), float(t_range[1]), USE_P=use_p, MEMO=memo, SLOTS=MEMO_SLOTS,
                         BLOCK=triton.next_power_of_2(V), CHUNK=32)
    return ids
