"""Alternative ``sdpa_cudnn``: PyTorch SDPA's CUDNN_ATTENTION backend backward (cuDNN fused attention).

What a user would run instead of writing the kernel: the backward that autograd runs after
``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` under
``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``, called through its ATen entry point so that it starts
from the task's saved state (``o`` and ``lse``) without re-running the forward:
``torch.ops.aten._scaled_dot_product_cudnn_attention_backward(do, q, k, v, o, lse, philox_seed,
philox_offset, None, cum_seq_q, cum_seq_k, S, S, 0.0, True, scale=scale)``.

* Layout: ``[B, S, H, D] -> [B, H, S, D]`` are transposed views (no copy); cuDNN takes the
  strides as they are.
* GQA: PyTorch's cuDNN path does not take grouped KV heads (``enable_gqa`` works with the flash
  and math backends only), so K and V are expanded to ``Hq`` heads first (``repeat_interleave``,
  head ``h`` gets KV head ``h // G``) and the per-query-head dK and dV are summed over each group
  afterwards, as autograd does through the expansion. Both cost time inside the call: the
  expanded K/V written and read, the ``Hq``-head gradients written and reduced.
* LSE: cuDNN's softmax statistics are float32 ``[B, Hq, S, 1]`` in natural log: the task's
  ``lse`` with a trailing unit dimension (a view).
* The dropout RNG state (unused at dropout 0) and the sequence-length tensors are taken from a
  one-token forward of the same backend (a few microseconds inside the timed call).

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (cuDNN exists there
only). On a CPU tensor :func:`_cudnn_bwd` runs PyTorch's CPU flash backward
(``_scaled_dot_product_flash_attention_for_cpu_backward``: same arguments, same contract)
instead, so that the tests check the GQA expansion, the group sum and the layout conversions
against the reference on the CPU (with a copy of the task that declares ``cpu``).
"""

from __future__ import annotations

import torch


def _cudnn_bwd(do, q, k, v, o, lse, scale: float):
    """Causal attention backward on ``[B, H, S, D]`` views with equal head counts: ``(dq, dk, dv)``."""
    S = q.shape[2]
    if q.is_cuda:
        fwd = torch.ops.aten._scaled_dot_product_cudnn_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, True,
                                                                 0.0, True, False, scale=scale)
        cum_q, cum_k, seed, offset = fwd[2], fwd[3], fwd[6], fwd[7]
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, o, lse.unsqueeze(-1), seed, offset, None, cum_q, cum_k, S, S, 0.0, True, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, True,
                                                                              scale=scale)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal GQA attention backward with SDPA's cuDNN backend (K and V expanded to the query
    heads, dK and dV summed back over each group).

    Args:
        q, o, do: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous BSHD.
        k, v: ``[B, S, Hkv, D]``, q's dtype, ``Hq`` a multiple of ``Hkv``.
        lse: ``[B, Hq, S]`` float32, natural log.
        scale: softmax scale.

    Returns:
        ``(dq [B, S, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, D])`` in q's dtype, contiguous.

    Raises:
        RuntimeError: cuDNN rejects the inputs (dtype, head dim, cuDNN version).
    """
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    ke, ve = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
    dq, dke, dve = _cudnn_bwd(*(x.transpose(1, 2) for x in (do, q, ke, ve, o)), lse, scale)
    dk = dke.transpose(1, 2).reshape(B, S, Hkv, G, D).sum(dim=3, dtype=torch.float32).to(k.dtype)
    dv = dve.transpose(1, 2).reshape(B, S, Hkv, G, D).sum(dim=3, dtype=torch.float32).to(v.dtype)
    return dq.transpose(1, 2).contiguous(), dk, dv
