"""Alternative ``flash_varlen_gathered``: what a user with PyTorch alone runs for a chunked
prefill over a paged cache: write the new keys and values into their slots with PyTorch
indexing, gather every request's keys (its context and its chunk) out of the pages into one
packed contiguous K/V, then FlashAttention-2 varlen as PyTorch ships it
(``torch.ops.aten._flash_attention_forward`` with ``cu_seqlens_q`` and the packed
``cu_seqlens_k``, ``is_causal=True``: FlashAttention-2 aligns the causal mask to the bottom
right when a sequence has more keys than queries, which is exactly the shifted diagonal;
native GQA).

The gather costs an extra write and read of every context (the ``gathered`` work model) and
one host read of the total key count. Declared for ``cuda`` only; on CPU tensors the attention
runs through :func:`_cpu_attention` (a masked SDPA per request) so that the tests check the
gather and the packing on the CPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location("chunked_prefill_paged_alt_gather", Path(__file__).with_name("_gather.py"))
_gather = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gather)


def _cpu_attention(q, k, v, cu_q, cu_k, scale):
    """CPU stand-in of the varlen call: per request, SDPA with the bottom-right causal mask."""
    o = torch.empty_like(q)
    G = q.shape[1] // k.shape[1]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qs, ks, vs = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
        nq, nk = qs.shape[0], ks.shape[0]
        mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
        out = F.scaled_dot_product_attention(qs.transpose(0, 1).float(), ks.transpose(0, 1).float().repeat_interleave(G, 0),
                                             vs.transpose(0, 1).float().repeat_interleave(G, 0), attn_mask=mask, scale=scale)
        o[cq[i]:cq[i + 1]] = out.transpose(0, 1).to(q.dtype)
    return o


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Same arguments and results as ``reference.run`` (caches updated in place; ``o [T, Hq, D]``).

    Raises:
        RuntimeError: the flash backend rejects the inputs (dtype, head dim, GPU).
    """
    NB, BS, Hkv, D = k_cache.shape
    _gather.write_cache(k_new, v_new, k_cache, v_cache, slot_mapping)
    slots, cu_k, max_k = _gather.packed_key_slots(cu_seqlens_q, context_lens, block_tables, BS)
    k = k_cache.view(NB * BS, Hkv, D)[slots]
    v = v_cache.view(NB * BS, Hkv, D)[slots]
    if q.is_cuda:
        o = torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens_q, cu_k, max_seqlen_q, max_k,
                                                    0.0, True, False, scale=scale)[0]
    else:
        o = _cpu_attention(q, k, v, cu_seqlens_q, cu_k, scale)
    return o.contiguous()
