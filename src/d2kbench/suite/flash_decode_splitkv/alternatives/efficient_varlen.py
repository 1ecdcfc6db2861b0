"""Alternative ``efficient_varlen``: PyTorch's memory-efficient attention (the CUTLASS kernel from
xFormers) through the ATen op ``torch.ops.aten._efficient_attention_forward`` with
``cu_seqlens`` and per-sequence key lengths ``seqlen_k``.

What a user with PyTorch alone would run for this decode step when the flash backend does not
serve it; the kernel has no grouped KV heads, so instead of expanding K and V (G times the cache
traffic) the ``G`` query heads of a KV head become ``G`` query rows of that KV head:

* queries: ``q [B, Hq, D] -> [B, Hkv, G, D] -> [B * G, Hkv, D]`` (a small copy), sequence ``b``
  owning rows ``b G .. b G + G - 1`` (``cu_seqlens_q = 0, G, 2 G, ...``);
* keys and values: the cache ``[B, LMAX, Hkv, D]`` viewed as ``[1, B * LMAX, Hkv, D]`` (no copy),
  sequence ``b`` starting at row ``b LMAX`` (``cu_seqlens_k``) and using ``seqlen_k =
  cache_seqlens`` rows: the NaN rows past the length are never read, and the lengths stay on the
  device (graph-capturable);
* LSE: returned as ``[B, Hkv, M]`` float32 with ``M >= G`` (padded to the kernel's alignment),
  natural log: its first G entries are the G query heads of each KV head.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only. On a CPU tensor the
call goes to :func:`_varlen_cpu.varlen_attention` (same packing; its LSE comes back as
``[Hkv, total_q]`` and is brought to the CUDA kernel's layout) so that the tests check the head
packing and the LSE conversion on the CPU.
"""

from __future__ import annotations

import torch

from d2kbench.suite.flash_decode_splitkv.alternatives._varlen_cpu import varlen_attention


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention with memory-efficient attention, cu_seqlens + seqlen_k.

    Args:
        q: ``[B, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[B, LMAX, Hkv, D]`` contiguous, q's dtype.
        cache_seqlens: ``[B]`` int32 (device).
        scale: softmax scale.

    Returns:
        ``(o [B, Hq, D] in q's dtype, lse [B, Hq] float32)`` (new tensors).

    Raises:
        RuntimeError: the backend rejects the inputs.
    """
    B, Hq, D = q.shape
    _, LMAX, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    rows = q.view(B, Hkv, G, D).transpose(1, 2).reshape(B * G, Hkv, D)        # [B*G, Hkv, D]
    seq = torch.arange(B + 1, device=q.device, dtype=torch.int32)
    cu_q, cu_k = seq * G, seq * LMAX
    k, v = k_cache.view(B * LMAX, Hkv, D), v_cache.view(B * LMAX, Hkv, D)
    if q.is_cuda:
        o, lse = torch.ops.aten._efficient_attention_forward(rows[None], k[None], v[None], None, cu_q, cu_k, G, LMAX,
                                                             0.0, 0, True, scale=scale, seqlen_k=cache_seqlens)[:2]
        o, lse = o[0], lse[:, :, :G]                                                # [B*G, Hkv, D], [B, Hkv, G]
    else:  # the CPU stand-in (see the module docstring)
        o, lse = varlen_attention(rows, k, v, cu_q, cu_k, cache_seqlens, scale)
        lse = lse.view(Hkv, B, G).transpose(0, 1)                                   # [B, Hkv, G]
    o = o.view(B, G, Hkv, D).transpose(1, 2).reshape(B, Hq, D)
    return o, lse.reshape(B, Hq).contiguous()
