"""CPU stand-in of the two ATen varlen attention entry points the CUDA-only alternatives of this
task call (``_flash_attention_forward`` with ``seqused_k`` and ``_efficient_attention_forward``
with ``seqlen_k``), with their argument conventions and output layouts, so that the tests check
the alternatives' packing, head mapping and LSE conversions against the reference on the CPU
(with a copy of the task that declares ``cpu``). Not a comparator: plain float32 PyTorch.
"""

from __future__ import annotations

import torch


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                     used_k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention of packed sequences.

    Args:
        q: ``[total_q, Hq, D]``; sequence ``i`` owns rows ``cu_q[i] .. cu_q[i+1]-1``.
        k, v: ``[total_k, Hkv, D]`` (``Hq`` a multiple of ``Hkv``; query head ``h`` reads KV head
            ``h // (Hq / Hkv)``); sequence ``i`` uses rows ``cu_k[i] .. cu_k[i] + used_k[i] - 1``.
        cu_q, cu_k: ``[n + 1]`` int32 offsets; used_k: ``[n]`` int32 key counts.
        scale: softmax scale.

    Returns:
        ``(o [total_q, Hq, D] in q's dtype, lse [Hq, total_q] float32, natural log)``.
    """
    total_q, Hq, D = q.shape
    G = Hq // k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((Hq, total_q), dtype=torch.float32)
    for i in range(cu_q.numel() - 1):
        q0, q1, k0 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i])
        kk = k[k0:k0 + int(used_k[i])].float().repeat_interleave(G, dim=1)      # [n_k, Hq, D]
        vv = v[k0:k0 + int(used_k[i])].float().repeat_interleave(G, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), kk) * scale
        lse[:, q0:q1] = torch.logsumexp(s, dim=-1)
        o[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv).to(q.dtype)
    return o, lse
