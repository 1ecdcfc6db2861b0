"""Shared glue of the alternatives (trusted code): the per-token request and position, the cache
write with PyTorch indexing, and the packed key slots of every request."""

from __future__ import annotations

import torch


def token_positions(cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(request [T], position [T])`` int64 of every new token: its request and its absolute
    position ``ctx_i + r`` in that request."""
    N = context_lens.shape[0]
    ql = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    req = torch.repeat_interleave(torch.arange(N, device=ql.device), ql, output_size=T)
    r = torch.arange(T, device=ql.device) - cu_seqlens_q.long()[req]
    return req, context_lens.long()[req] + r


def write_cache(k_new, v_new, k_cache, v_cache, slot_mapping) -> None:
    """``cache.view(NB * BS, Hkv, D)[slot_mapping] = new`` for K and V (PyTorch ``index_copy_``)."""
    NB, BS, Hkv, D = k_cache.shape
    k_cache.view(NB * BS, Hkv, D).index_copy_(0, slot_mapping, k_new)
    v_cache.view(NB * BS, Hkv, D).index_copy_(0, slot_mapping, v_new)


def packed_key_slots(cu_seqlens_q, context_lens, block_tables, BS: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(slots [K], cu_seqlens_k [N + 1] int32, max_seqlen_k)``: the cache slot of every key
    (context and chunk) of every request, packed request after request (one host read of the
    total, as a user's gather does)."""
    ql = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    kl = context_lens.long() + ql
    cu_k = torch.zeros(kl.shape[0] + 1, dtype=torch.int64, device=kl.device)
    cu_k[1:] = torch.cumsum(kl, 0)
    total = int(cu_k[-1])
    req = torch.repeat_interleave(torch.arange(kl.shape[0], device=kl.device), kl, output_size=total)
    pos = torch.arange(total, device=kl.device) - cu_k[req]
    slots = block_tables.long()[req, pos // BS] * BS + pos % BS
    return slots, cu_k.to(torch.int32), int(kl.max())
