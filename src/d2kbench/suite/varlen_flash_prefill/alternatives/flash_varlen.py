"""Alternative ``flash_varlen``: FlashAttention-2 as PyTorch ships it, through the ATen op
``torch.ops.aten._flash_attention_forward`` in its variable-length form.

What a user with PyTorch alone would run for a packed prefill batch (SDPA's public entry point
takes no cu_seqlens): ``_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen,
max_seqlen, 0.0, is_causal=True, return_debug_mask=False, scale=scale)``.

* Layout: q, k, v are already packed THD (``[total, H, D]``); the output comes back packed.
* GQA: FlashAttention-2 maps query head ``h`` to KV head ``h // G`` itself (no expansion).
* LSE: FlashAttention-2's varlen ``softmax_lse`` is float32 ``[Hq, total_q]``, natural log
  (``mha_varlen_fwd``, unpadded LSE): the task's layout.
* The lengths stay on the device (graph-capturable); ``max_seqlen`` sizes the kernel's grid.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only. On a CPU tensor the
call goes to :func:`_cpu_varlen` (PyTorch's CPU flash kernel per sequence, same output
layout) so that the tests check the argument conventions and the LSE layout on the CPU.
"""

from __future__ import annotations

import torch


def _cpu_varlen(q, k, v, cu_seqlens, scale):
    """CPU stand-in with the varlen op's outputs: ``(o [T, Hq, D], lse [Hq, T] float32)``."""
    o, lse = torch.empty_like(q), torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    cu = cu_seqlens.tolist()
    for s in range(len(cu) - 1):
        b0, b1 = cu[s], cu[s + 1]
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[b0:b1].transpose(0, 1)[None], k[b0:b1].transpose(0, 1)[None], v[b0:b1].transpose(0, 1)[None],
            0.0, True, scale=scale)
        o[b0:b1] = out[0][0].transpose(0, 1)
        lse[:, b0:b1] = out[1][0]
    return o, lse


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen causal GQA attention with FlashAttention-2 (ATen).

    Args:
        q: ``[T, Hq, D]`` bf16 (fp16 on smoke workloads); k, v: ``[T, Hkv, D]``.
        cu_seqlens: ``[N + 1]`` int32 (device); max_seqlen: host int; scale: softmax scale.

    Returns:
        ``(o [T, Hq, D] in q's dtype, lse [Hq, T] float32)``, new contiguous tensors.

    Raises:
        RuntimeError: the flash backend rejects the inputs (dtype, head dim, GPU).
    """
    if q.is_cuda:
        o, lse = torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                                         0.0, True, False, scale=scale)[:2]
    else:  # the CPU stand-in (see the module docstring)
        o, lse = _cpu_varlen(q, k, v, cu_seqlens, scale)
    return o.contiguous(), lse.reshape(q.shape[1], q.shape[0]).contiguous()
