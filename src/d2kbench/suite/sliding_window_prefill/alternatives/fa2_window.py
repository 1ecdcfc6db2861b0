"""Alternative ``fa2_window``: FlashAttention-2 as PyTorch ships it, with its sliding window,
through ``torch.ops.aten._flash_attention_forward(q, k, v, None, None, S, S, 0.0, True, False,
scale=scale, window_size_left=W - 1, window_size_right=0)``.

* Layout BSHD as given (dense batch: no cu_seqlens); native GQA (query head ``h`` reads KV
  head ``h // G``); FlashAttention-2 skips the key tiles outside the window.
* LSE: ``softmax_lse`` float32 ``[B, Hq, S]``, natural log.
* Sinks (gpt-oss) are not an argument of the ATen op: folded in afterwards from the LSE
  (:mod:`_sinks`, two elementwise passes), as a serving stack without sink support would.
* Soft-capping: FlashAttention-2's CUDA kernel has it, but the ATen op does not expose it, so a
  workload with ``softcap > 0`` is refused with a ValueError (this alternative cannot serve
  Gemma-2; the flex_attention and FlashInfer alternatives can).

Device switch: declared for ``cuda`` only. On a CPU tensor :func:`_flash` runs PyTorch's CPU
flash kernel with an explicit additive band mask (same ``(o, lse)`` contract) so that the tests
check the window convention, the sink folding and the layouts on the CPU.
"""

from __future__ import annotations

import torch

from d2kbench.suite.sliding_window_prefill.alternatives._sinks import fold_sinks


def _band(S: int, W: int, dtype, device) -> torch.Tensor:
    """Additive band mask ``[S, S]`` (0 inside the window, -inf outside) for the CPU stand-in."""
    i = torch.arange(S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return torch.zeros((S, S), dtype=dtype, device=device).masked_fill_(~((j <= i) & (j > i - W)), float("-inf"))


def _flash(q, k, v, scale, W):
    """Windowed causal attention on BSHD tensors: ``(o [B, S, Hq, D], lse [B, Hq, S])``."""
    S = q.shape[1]
    if q.is_cuda:
        out = torch.ops.aten._flash_attention_forward(q, k, v, None, None, S, S, 0.0, True, False, scale=scale,
                                                      window_size_left=W - 1, window_size_right=0)
        return out[0], out[1]
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(  # the CPU stand-in
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, False, attn_mask=_band(S, W, q.dtype, q.device),
        scale=scale)
    return out[0].transpose(1, 2), out[1]


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window attention with FlashAttention-2 (ATen), sinks folded in from the LSE.

    Returns:
        ``(o [B, S, Hq, D] in q's dtype, lse [B, Hq, S] float32)``, new contiguous tensors.

    Raises:
        ValueError: ``softcap > 0`` (the ATen op has no soft-cap argument).
        RuntimeError: the flash backend rejects the inputs.
    """
    if softcap > 0:
        raise ValueError("FlashAttention-2 through ATen (_flash_attention_forward) takes no soft-cap: "
                         "this alternative cannot compute soft-capped logits")
    B, S, Hq, _ = q.shape
    o, lse = _flash(q, k, v, scale, min(int(window), S))
    o, lse = fold_sinks(o, lse.reshape(B, Hq, -1)[:, :, :S], sinks)
    return o.contiguous(), lse.contiguous()
