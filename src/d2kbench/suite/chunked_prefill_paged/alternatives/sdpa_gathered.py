"""Alternative ``sdpa_gathered``: the plain PyTorch path a user writes first. Write the new keys
and values into their slots with PyTorch indexing, then per request (lengths read on the host)
gather the context pages, append the chunk, expand K and V to the query heads and call
``F.scaled_dot_product_attention`` with ``torch.nn.attention.bias.causal_lower_right`` (the
causal mask aligned to the last key: new token r sees ctx + r + 1 keys), under the
memory-efficient backend, which takes that bias without materialising a mask.

Declared for ``cuda`` only; on the CPU the same code runs through SDPA's math path (the bias
is materialised), which the tests use to check the gathers and the mask alignment.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

_spec = importlib.util.spec_from_file_location("chunked_prefill_paged_alt_gather_sdpa", Path(__file__).with_name("_gather.py"))
_gather = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gather)


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Same arguments and results as ``reference.run`` (caches updated in place; ``o [T, Hq, D]``)."""
    NB, BS, Hkv, D = k_cache.shape
    T, Hq, _ = q.shape
    G = Hq // Hkv
    _gather.write_cache(k_new, v_new, k_cache, v_cache, slot_mapping)
    o = torch.empty_like(q)
    cu, ctxs = cu_seqlens_q.tolist(), context_lens.tolist()
    backends = [SDPBackend.EFFICIENT_ATTENTION] if q.is_cuda else [SDPBackend.MATH]
    for i, ctx in enumerate(ctxs):
        b0, b1 = cu[i], cu[i + 1]
        n = b1 - b0
        pages = block_tables[i, :(ctx + n + BS - 1) // BS].long()
        k = k_cache[pages].reshape(-1, Hkv, D)[:ctx + n]          # the chunk was just written: read it back
        v = v_cache[pages].reshape(-1, Hkv, D)[:ctx + n]
        qs = q[b0:b1].transpose(0, 1)[None]
        ks = k.transpose(0, 1).repeat_interleave(G, 0)[None]
        vs = v.transpose(0, 1).repeat_interleave(G, 0)[None]
        with sdpa_kernel(backends):
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=causal_lower_right(n, ctx + n), scale=scale)
        o[b0:b1] = out[0].transpose(0, 1)
    return o
