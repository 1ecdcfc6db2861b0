"""MoE align-block-size, straightforward Triton port (no expert design).

A competent direct translation of the textbook counting sort, one kernel per stage:

1. ``_count_kernel``: one atomic increment of ``counts[e]`` per id (grid over the ids);
2. ``_scan_kernel`` (one program): padded counts, their exclusive scan, the total, the
   per-expert write cursors (= segment starts) and ``expert_ids``;
3. ``_scatter_kernel``: each id takes ``slot = atomic_add(cursor[e], 1)`` (grid over the ids).

``sorted_token_ids`` is first filled with the sentinel everywhere (``torch.full``) and the
counters are zeroed (``torch.zeros``). Shapes as in ``reference.run``: ``topk_ids [T, k]``
int32 -> ``(sorted_token_ids [n + E (B-1)], expert_ids [ceil((n + E (B-1)) / B)],
num_tokens_post_padded [1])``, all int32, ``n = T k``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 256 if _INTERPRET else 1024


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    """counts[e] += 1 for every id e (one atomic per id)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    tl.atomic_add(counts_ptr + e, 1, mask=m)


@triton.jit
def _scan_kernel(counts_ptr, cursor_ptr, eids_ptr, ntpp_ptr, num_experts, block_size,
                 E_PAD: tl.constexpr, EID_TILE: tl.constexpr):
    """One program: padded counts, segment starts (into the cursors), total, expert_ids."""
    ex = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + ex, mask=ex < num_experts, other=0)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + ex, ends - padded, mask=ex < num_experts)
    total = tl.sum(padded, 0)
    tl.store(ntpp_ptr, total)
    nb = total // block_size
    for b0 in range(0, nb, EID_TILE):
        b = b0 + tl.arange(0, EID_TILE)
        owner = tl.sum((ends[None, :] <= (b * block_size)[:, None]).to(tl.int32), axis=1)
        tl.store(eids_ptr + b, owner, mask=b < nb)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, n, BLOCK: tl.constexpr):
    """sorted[atomic_add(cursor[e], 1)] = i for every id i."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    slot = tl.atomic_add(cursor_ptr + e, 1, mask=m)
    tl.store(sorted_ptr + slot, offs, mask=m)


def run(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """Align ``topk_ids [T, k]`` int32 into expert segments padded to ``block_size``."""
    T, k = topk_ids.shape
    n, E, B = T * k, int(num_experts), int(block_size)
    ids = topk_ids.contiguous()
    dev = ids.device
    length = n + E * (B - 1)
    sorted_ids = torch.full((length,), n, dtype=torch.int32, device=dev)
    expert_ids = torch.empty((length + B - 1) // B, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    E_PAD = triton.next_power_of_2(max(E, 2))
    counts = torch.zeros(E, dtype=torch.int32, device=dev)
    cursor = torch.empty(E, dtype=torch.int32, device=dev)
    grid = (triton.cdiv(n, BLOCK),)
    _count_kernel[grid](ids, counts, n, BLOCK=BLOCK)
    _scan_kernel[(1,)](counts, cursor, expert_ids, ntpp, E, B, E_PAD=E_PAD, EID_TILE=max(2, min(64, 8192 // E_PAD)))
    _scatter_kernel[grid](ids, cursor, sorted_ids, n, BLOCK=BLOCK)
    return sorted_ids, expert_ids, ntpp
