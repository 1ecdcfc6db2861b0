"""Alternative ``flash_varlen``: FlashAttention-2 as PyTorch ships it, through the ATen op
``torch.ops.aten._flash_attention_forward`` in its variable-length form with ``seqused_k``.

What a user with PyTorch alone would run for this decode step (SDPA's public entry point takes
no per-sequence key lengths, and FlashAttention-2 rejects a mask). The call packs nothing:

* queries: ``q [B, Hq, D]`` is already a packed batch of one-token sequences
  (``cum_seq_q = 0, 1, ..., B``, ``max_q = 1``);
* keys and values: the cache ``[B, LMAX, Hkv, D]`` viewed as one packed key sequence of LMAX rows
  per request (``cum_seq_k = 0, LMAX, 2 LMAX, ...``, a view, no copy) of which the kernel uses only
  the first ``seqused_k = cache_seqlens`` rows: the NaN rows past the length are never read, and
  the lengths stay on the device (graph-capturable);
* GQA: FlashAttention-2 maps query head ``h`` to KV head ``h // G`` itself;
* LSE: returned as ``[Hq, total_q]`` float32, natural log: transposed to the task's ``[B, Hq]``.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only. On a CPU tensor the
call goes to :func:`_varlen_cpu.varlen_attention` (same arguments, same output layout) so that
the tests check the packing and the LSE conversion on the CPU.
"""

from __future__ import annotations

import torch

from d2kbench.suite.flash_decode_splitkv.alternatives._varlen_cpu import varlen_attention


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention with FlashAttention-2 varlen + seqused_k.

    Args:
        q: ``[B, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[B, LMAX, Hkv, D]`` contiguous, q's dtype.
        cache_seqlens: ``[B]`` int32 (device).
        scale: softmax scale.

    Returns:
        ``(o [B, Hq, D] in q's dtype, lse [B, Hq] float32)`` (new tensors).

    Raises:
        RuntimeError: the flash backend rejects the inputs (dtype, head dim, GPU).
    """
    B, LMAX, Hkv, D = k_cache.shape
    cu_q = torch.arange(B + 1, device=q.device, dtype=torch.int32)
    cu_k = cu_q * LMAX
    k, v = k_cache.view(B * LMAX, Hkv, D), v_cache.view(B * LMAX, Hkv, D)
    if q.is_cuda:
        o, lse = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 1, LMAX, 0.0, False, False,
                                                         scale=scale, seqused_k=cache_seqlens)[:2]
    else:  # the CPU stand-in (see the module docstring)
        o, lse = varlen_attention(q, k, v, cu_q, cu_k, cache_seqlens, scale)
    return o, lse.t().contiguous()
