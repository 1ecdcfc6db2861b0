"""Alternative ``sdpa_cudnn``: gather the pages into a dense cache, then PyTorch SDPA with its
CUDNN_ATTENTION backend (cuDNN fused attention) and a boolean key-length mask.

What a user without a paged-attention kernel would run with cuDNN. Every step is inside the
timed call, because a user has to do all of it on every decode step:

1. Gather: ``k_cache[block_tables]`` copies every sequence's pages, in token order, up to the
   table capacity ``L = MAXB * BS`` (the lengths live on the device; cutting at the longest
   sequence would need a host read, which CUDA-graph replay forbids): ``[B, L, Hkv, D]`` for K
   and for V, i.e. writing and reading again ``4 * B * L * Hkv * D`` bytes in bf16 on top of the
   attention itself.
2. Zero the tokens at or past ``seq_lens[b]``: they are NaN in this task's cache, and a masked
   score does not stop ``0 * NaN`` in the ``P @ V`` product.
3. Attention: the ``G = Hq / Hkv`` query heads that share a KV head become ``G`` query rows of
   that head (``q`` viewed as ``[B, Hkv, G, D]``), so K and V need no expansion (PyTorch's cuDNN
   path takes no grouped KV heads), with the mask ``t < seq_lens[b]`` broadcast as
   ``[B, 1, 1, L]`` (SDPA turns it into the additive bias cuDNN takes).

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (cuDNN exists there
only). On a CPU tensor :func:`_attend` calls SDPA without selecting a backend (PyTorch picks its
CPU kernel), so that the tests check the gather, the mask and the head packing against the
reference on the CPU (with a copy of the task that declares ``cpu``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: The SDPA backend this alternative measures.
BACKEND = SDPBackend.CUDNN_ATTENTION


def _key_mask(seq_lens: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, length]`` bool: token ``t`` of sequence ``b`` is valid (``t < seq_lens[b]``)."""
    return torch.arange(length, device=seq_lens.device)[None, :] < seq_lens[:, None]


def _dense(cache: torch.Tensor, block_tables: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The pages of each sequence in token order, ``[NB, BS, Hkv, D] -> [B, MAXB * BS, Hkv, D]``
    (a copy), with invalid tokens set to zero."""
    dense = cache[block_tables.long()].flatten(1, 2)
    return dense.masked_fill_(~valid[:, :, None, None], 0)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA with :data:`BACKEND` on CUDA (PyTorch's choice on the CPU): ``[B, Hkv, G, D]``."""
    if not q.is_cuda:  # the CPU stand-in (see the module docstring)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    with sdpa_kernel(BACKEND):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Paged GQA decode as gather + masked SDPA (no host synchronisation: graph-capturable).

    Args:
        q: ``[B, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[NB, BS, Hkv, D]``, q's dtype, NHD pages; NaN in unused slots.
        block_tables: ``[B, MAXB]`` int32 page ids (device).
        seq_lens: ``[B]`` int32 lengths in ``[1, MAXB * BS]`` (device).
        scale: softmax scale.

    Returns:
        ``o [B, Hq, D]`` in q's dtype (a new tensor).

    Raises:
        RuntimeError: the backend rejects the inputs ("No available kernel").
    """
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    valid = _key_mask(seq_lens, block_tables.shape[1] * k_cache.shape[1])
    k = _dense(k_cache, block_tables, valid).transpose(1, 2)  # [B, Hkv, L, D]
    v = _dense(v_cache, block_tables, valid).transpose(1, 2)
    o = _attend(q.reshape(B, Hkv, Hq // Hkv, D), k, v, valid[:, None, None, :], scale)
    return o.reshape(B, Hq, D)
