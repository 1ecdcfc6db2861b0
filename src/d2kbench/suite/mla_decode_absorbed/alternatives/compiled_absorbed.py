"""Alternative ``compiled_absorbed``: the absorbed MLA formulation written in plain PyTorch and
compiled by ``torch.compile`` (default mode, one specialisation per workload shape), what a user
would try before writing a kernel once they know the absorption trick.

The function gathers every request's latent rows up to the table capacity (the lengths are on the
device), computes ``q_lat = q_nope @ w_uk``, float32 scores ``q_lat . c + q_pe . k_pe`` over the
gathered rows (bf16 scores would cost the tolerance), a length-masked softmax, ``P @ c`` over the
first DL columns and ``@ w_uv``; inductor fuses the gather, the cast, the mask and the softmax
around the matrix products (cuBLAS). No host synchronisation: graph-capturable. Compilation runs
on the first call (warm-up, excluded from timing).

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (that is where it would be
compiled for speed). On a CPU tensor the same function runs eagerly, so that the tests check its
algebra against the reference on the CPU without minutes of C++ compilation.
"""

from __future__ import annotations

import torch

#: Compiled variants kept per function before dynamo falls back to eager (its default is 8).
RECOMPILE_LIMIT = 64


def absorbed(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
             seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """Absorbed MLA decode in PyTorch operations: ``o [B, H, DV]`` in q_nope's dtype."""
    B, H, _ = q_nope.shape
    DL = w_uv.shape[1]
    L = block_table.shape[1] * kv_cache.shape[1]
    valid = torch.arange(L, device=q_nope.device)[None, :] < seq_lens[:, None]                  # [B, L]
    rows = torch.where(valid[:, :, None], kv_cache[block_table.long()].flatten(1, 2).float(), 0.0)   # [B, L, DL + DR]
    q_lat = torch.bmm(q_nope.transpose(0, 1).float(), w_uk.float()).transpose(0, 1)           # [B, H, DL]
    q = torch.cat([q_lat, q_pe.float()], dim=-1)                                              # [B, H, DL + DR]
    s = torch.bmm(q, rows.transpose(1, 2)) * scale                                            # [B, H, L]
    p = torch.softmax(s.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
    o_lat = torch.bmm(p, rows[..., :DL])                                                      # [B, H, DL]
    return torch.bmm(o_lat.transpose(0, 1), w_uv.float()).transpose(0, 1).to(q_nope.dtype).contiguous()


_compiled = None


def run(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """:func:`absorbed` under ``torch.compile`` on CUDA (eager on the CPU, see the module docstring)."""
    global _compiled
    if not q_nope.is_cuda:
        return absorbed(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale)
    if _compiled is None:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _compiled = torch.compile(absorbed, dynamic=False)
    return _compiled(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale)
