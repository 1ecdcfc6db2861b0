"""Alternative ``sdpa_flash``: PyTorch SDPA's FLASH_ATTENTION backend backward (FlashAttention-2).

What a user would run instead of writing the kernel: the backward that autograd runs after
``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`` under
``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, called through its ATen entry point so that it
starts from the task's saved state (``o`` and ``lse``) exactly as the autograd node does, without
re-running the forward:
``torch.ops.aten._scaled_dot_product_flash_attention_backward(do, q, k, v, o, lse, cum_seq_q,
cum_seq_k, S, S, 0.0, True, philox_seed, philox_offset, scale=scale)``.

* Layout: ``[B, S, H, D] -> [B, H, S, D]`` are transposed views (no copy); the kernel reads
  BSHD memory as it is and returns gradients whose ``.transpose(1, 2)`` is BSHD.
* GQA: FlashAttention-2's backward takes ``Hkv < Hq`` itself (it is the backend behind
  ``enable_gqa=True``): it accumulates per-query-head dK/dV and sums them over the group.
* LSE: FlashAttention-2's ``softmax_lse`` is float32 ``[B, Hq, S]`` in natural log, the task's
  unit and shape, so the task's ``lse`` is passed as it is.
* The non-tensor state of the autograd node (the sequence-length tensors and the dropout RNG
  state, unused at dropout 0) is taken from a one-token forward of the same backend (a few
  microseconds inside the timed call), so that the backward gets exactly the objects it would
  get from autograd.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (the backend exists
there only). On a CPU tensor :func:`_flash_bwd` runs PyTorch's CPU flash backward
(``_scaled_dot_product_flash_attention_for_cpu_backward``, GQA-aware as well) instead, so that
the tests check the layout conversions against the reference on the CPU (with a copy of the task
that declares ``cpu``).
"""

from __future__ import annotations

import torch


def _flash_bwd(do, q, k, v, o, lse, scale: float):
    """Causal flash backward on ``[B, H, S, D]`` views: ``(dq, dk, dv)`` in the same layout."""
    S = q.shape[2]
    if q.is_cuda:
        fwd = torch.ops.aten._scaled_dot_product_flash_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], 0.0, True,
                                                                 False, scale=scale)
        cum_q, cum_k, seed, offset = fwd[2], fwd[3], fwd[6], fwd[7]
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, o, lse, cum_q, cum_k, S, S, 0.0, True, seed, offset, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, True,
                                                                              scale=scale)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal GQA attention backward with SDPA's flash backend.

    Args:
        q, o, do: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous BSHD.
        k, v: ``[B, S, Hkv, D]``, q's dtype, ``Hq`` a multiple of ``Hkv``.
        lse: ``[B, Hq, S]`` float32, natural log.
        scale: softmax scale.

    Returns:
        ``(dq [B, S, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, D])`` in q's dtype, contiguous.

    Raises:
        RuntimeError: the flash backend rejects the inputs (dtype, head dim, GPU).
    """
    t = [x.transpose(1, 2) for x in (do, q, k, v, o)]
    dq, dk, dv = _flash_bwd(*t, lse, scale)
    return dq.transpose(1, 2).contiguous(), dk.transpose(1, 2).contiguous(), dv.transpose(1, 2).contiguous()
