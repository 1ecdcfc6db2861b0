"""Alternative ``sdpa_padded``: pad the packed sequences into a dense batch, run SDPA's
FLASH_ATTENTION backend, unpad.

What a user of plain (non-varlen) attention APIs does with a packed batch:

* padding: token ``t`` of sequence ``s`` (found with ``searchsorted`` on ``cu_seqlens``, on the
  device) goes to row ``t - cu_seqlens[s]`` of batch entry ``s`` of zero-filled
  ``[N, max_seqlen, H, D]`` tensors (q, k and v: three scatters);
* attention: ``torch.ops.aten._scaled_dot_product_flash_attention`` with ``is_causal=True`` on
  ``[N, H, max_seqlen, D]`` views (native GQA, returns the LSE ``[N, Hq, max_seqlen]``, natural
  log). With top-left causal alignment the padded keys sit after every real query of their
  batch entry, so they never enter a real row's softmax; the padded rows are computed and
  thrown away: the dense batch costs ``N max_seqlen^2 / 2`` pairs per head instead of
  ``sum_s L_s^2 / 2`` (4.5x-6.7x on the registered workloads, see task.yaml ``padded``);
* unpadding: ``o`` and ``lse`` gathered back to the packed rows.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only. On a CPU tensor
:func:`_flash` runs PyTorch's CPU flash kernel (same arguments, same ``(o, lse)`` contract), so
that the tests check the padding and the gathers on the CPU.
"""

from __future__ import annotations

import torch


def _flash(q, k, v, scale):
    """Causal attention on ``[N, H, L, D]`` views: ``(o, lse [N, Hq, L])``."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
    else:  # the CPU stand-in (see the module docstring)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return out[0], out[1]


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen causal GQA attention as a padded dense batch (SDPA flash backend).

    Args:
        q: ``[T, Hq, D]`` bf16 (fp16 on smoke workloads); k, v: ``[T, Hkv, D]``.
        cu_seqlens: ``[N + 1]`` int32 (device); max_seqlen: host int; scale: softmax scale.

    Returns:
        ``(o [T, Hq, D] in q's dtype, lse [Hq, T] float32)``, new contiguous tensors.

    Raises:
        RuntimeError: the flash backend rejects the inputs.
    """
    T, Hq, D = q.shape
    N = cu_seqlens.shape[0] - 1
    tok = torch.arange(T, device=q.device)
    seq = torch.searchsorted(cu_seqlens[1:].long(), tok, right=True)        # sequence of each token
    pos = tok - cu_seqlens.long()[seq]                                      # position inside it

    def pad(x):
        out = x.new_zeros((N, max_seqlen, x.shape[1], D))
        out[seq, pos] = x
        return out.transpose(1, 2)                                          # [N, H, L, D] view

    o_p, lse_p = _flash(pad(q), pad(k), pad(v), scale)                      # [N, Hq, L, D], [N, Hq, L]
    o = o_p.transpose(1, 2)[seq, pos]                                       # [T, Hq, D]
    lse = lse_p.reshape(N, Hq, -1)[seq, :, pos].t()                         # [Hq, T]
    return o.contiguous(), lse.float().contiguous()
