"""Alternative ``sdpa_absorbed``: absorbed MLA decode assembled from PyTorch's own kernels, what a
user without FlashMLA or FlashInfer's MLA kernel would run.

1. Absorption: ``q_lat = q_nope @ w_uk`` per head by ``torch.bmm`` (cuBLAS), concatenated with
   ``q_pe`` into one 576-wide query row per head.
2. The pages of every request gathered up to the table capacity into a dense latent cache
   ``[B, L, DL + DR]`` (the lengths are on the device: cutting at the longest request would need a
   host read, which CUDA-graph replay forbids), tokens at or past the length zeroed (they may be
   NaN, and a masked score does not stop ``0 * NaN``).
3. Attention as MQA over the latent: one "KV head" per request whose key is the whole row and
   whose value is its first DL columns (a strided view of the same copy), the H heads as H query
   rows, a boolean length mask, through SDPA's EFFICIENT_ATTENTION backend (it takes a key width
   of 576 and a value width of 512; FlashAttention-2 and cuDNN stop at 256).
4. ``o = o_lat @ w_uv`` per head by ``torch.bmm``.

No host synchronisation: graph-capturable.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (the backend exists there
only). On a CPU tensor :func:`_attend` calls SDPA without selecting a backend (PyTorch picks its
CPU kernel), so that the tests check the absorption, the gather, the mask and the views against
the reference on the CPU (with a copy of the task that declares ``cpu``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: The SDPA backend this alternative measures.
BACKEND = SDPBackend.EFFICIENT_ATTENTION


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA with :data:`BACKEND` on CUDA (PyTorch's choice on the CPU)."""
    if not q.is_cuda:  # the CPU stand-in (see the module docstring)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    with sdpa_kernel(BACKEND):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def run(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """Absorbed MLA decode with cuBLAS bmm + a dense latent gather + SDPA memory-efficient attention.

    Args:
        q_nope: ``[B, H, DN]`` bf16 (fp16 on smoke workloads); q_pe: ``[B, H, DR]``.
        kv_cache: ``[NP, PS, DL + DR]`` latent pages; NaN in rows that hold no valid token.
        block_table: ``[B, MAXP]`` int32 (device); seq_lens: ``[B]`` int32 (device).
        w_uk: ``[H, DN, DL]``; w_uv: ``[H, DL, DV]``.
        scale: softmax scale.

    Returns:
        ``o [B, H, DV]`` in q_nope's dtype (a new tensor).

    Raises:
        RuntimeError: the backend rejects the inputs ("No available kernel").
    """
    B, H, _ = q_nope.shape
    DL = w_uv.shape[1]
    L = block_table.shape[1] * kv_cache.shape[1]
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)                  # [B, H, DL]
    q = torch.cat([q_lat, q_pe], dim=-1)[:, None]                                     # [B, 1, H, DL + DR]
    valid = torch.arange(L, device=q.device)[None, :] < seq_lens[:, None]             # [B, L]
    rows = kv_cache[block_table.long()].flatten(1, 2).masked_fill_(~valid[:, :, None], 0)[:, None]
    o_lat = _attend(q, rows, rows[..., :DL], valid[:, None, None, :], scale)          # [B, 1, H, DL]
    return torch.bmm(o_lat[:, 0].transpose(0, 1), w_uv).transpose(0, 1).contiguous()  # [B, H, DV]
