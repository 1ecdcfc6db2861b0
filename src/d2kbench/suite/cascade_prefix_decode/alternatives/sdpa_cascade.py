"""Alternative ``sdpa_cascade``: cascade attention assembled from PyTorch's own attention kernels,
what a user without FlashInfer's cascade wrapper would build.

1. Prefix, once for all requests: the ``P // BS`` shared pages of table row 0 gathered into
   ``[Hkv, S0, D]`` with ``S0 = P // BS * BS`` (a copy of the shared prefix only; when P ends
   mid-page, the last prefix page is each request's own and goes with its suffix), the ``N * G`` (request, query head) pairs of each
   KV head as the query rows of one non-causal attention, through SDPA's FLASH_ATTENTION backend
   via ``torch.ops.aten._scaled_dot_product_flash_attention`` (it returns the LSE).
2. Suffixes: every request's pages from the one holding token ``S0`` to the end of its table row
   gathered into ``[N, Hkv, S, D]`` (the lengths are on the device, so the gather covers the table
   capacity), tokens outside ``[P, seq_len)`` zeroed (they may be NaN, and a masked score does
   not stop ``0 * NaN``), tokens outside ``[S0, seq_len)`` masked by an additive bias, through SDPA's EFFICIENT_ATTENTION
   backend via ``torch.ops.aten._scaled_dot_product_efficient_attention`` (with the LSE); the
   G query heads of a KV head are its G query rows, so K and V need no expansion.
3. Merge in PyTorch: ``o = (e^{lse_p} o_p + e^{lse_s} o_s) / (e^{lse_p} + e^{lse_s})`` with the
   maximum subtracted first; a request whose suffix is empty takes the prefix part alone (its
   suffix LSE is whatever the backend returns for a fully masked row, so it is not used).

No host synchronisation (``P`` is a host int): graph-capturable.

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (the backends exist
there only). On a CPU tensor both steps call PyTorch's CPU flash kernel
(``_scaled_dot_product_flash_attention_for_cpu``, same ``(o, lse)`` contract, the bias as
``attn_mask``) so that the tests check the gathers, the row packing, the masks and the merge
against the reference on the CPU (with a copy of the task that declares ``cpu``).
"""

from __future__ import annotations

import torch

#: The efficient backend reads the bias in rows aligned to this many elements.
BIAS_ALIGN = 16


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention on ``[B, H, M, D]`` views: ``(o [B, H, M, D], lse [B, H, M])``."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
    else:  # the CPU stand-in (see the module docstring)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)
    return out[0], out[1]


def _efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with an additive bias on ``[B, H, M, D]`` views: ``(o [B, H, M, D], lse [B, H, M])``."""
    M = q.shape[2]
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=scale)
    else:  # the CPU stand-in (see the module docstring)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                          scale=scale)
    return out[0], out[1][:, :, :M]                      # the CUDA LSE is padded along M


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, common_prefix_len: int, scale: float) -> torch.Tensor:
    """Cascade decode with SDPA flash (prefix) + SDPA efficient (suffixes) + an LSE merge.

    Args:
        q: ``[N, Hq, D]`` bf16 (fp16 on smoke workloads).
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` NHD pages; NaN in unused slots.
        block_tables: ``[N, MAXB]`` int32 (device), the first ``P // BS`` columns shared.
        seq_lens: ``[N]`` int32 (device), ``P <= seq_lens[i] <= MAXB * BS``.
        common_prefix_len: ``P`` (host int).
        scale: softmax scale.

    Returns:
        ``o [N, Hq, D]`` in q's dtype (a new tensor).

    Raises:
        RuntimeError: a backend rejects the inputs.
    """
    N, Hq, D = q.shape
    _, BS, Hkv, _ = k_cache.shape
    G, MAXB = Hq // Hkv, block_tables.shape[1]
    P = int(common_prefix_len) // BS * BS                  # the physically shared tokens (S0)
    rows = q.view(N, Hkv, G, D)
    parts = []                                            # (o [N, Hkv, G, D] fp32, lse [N, Hkv, G] fp32)
    if P > 0:
        pages = block_tables[0, :P // BS].long()
        kp = k_cache[pages].flatten(0, 1).transpose(0, 1)[None]                # [1, Hkv, S0, D]
        vp = v_cache[pages].flatten(0, 1).transpose(0, 1)[None]
        qp = rows.permute(1, 0, 2, 3).reshape(1, Hkv, N * G, D)
        o_p, lse_p = _flash(qp, kp, vp, scale)
        parts.append((o_p[0].reshape(Hkv, N, G, D).transpose(0, 1).float(),
                      lse_p[0].reshape(Hkv, N, G).transpose(0, 1)))
    first = P // BS                                       # the first page of a request's own
    window = (MAXB - first) * BS
    if MAXB * BS > P:
        pages = block_tables[:, first:].long()                                  # [N, MAXB - first]
        t = first * BS + torch.arange(window, device=q.device)
        valid = (t[None, :] >= P) & (t[None, :] < seq_lens[:, None])            # [N, window]
        ks = k_cache[pages].flatten(1, 2).masked_fill_(~valid[:, :, None, None], 0).transpose(1, 2)
        vs = v_cache[pages].flatten(1, 2).masked_fill_(~valid[:, :, None, None], 0).transpose(1, 2)
        padded = (window + BIAS_ALIGN - 1) // BIAS_ALIGN * BIAS_ALIGN
        bias = torch.zeros((N, 1, 1, padded), device=q.device, dtype=q.dtype)[..., :window]
        bias.masked_fill_(~valid[:, None, None, :], float("-inf"))
        o_s, lse_s = _efficient(rows, ks, vs, bias.expand(N, Hkv, G, window), scale)
        empty = (seq_lens <= P)[:, None, None]                                  # no suffix token
        parts.append((torch.where(empty[..., None], 0.0, o_s.float()), torch.where(empty, float("-inf"), lse_s.float())))
    m = parts[0][1] if len(parts) == 1 else torch.maximum(parts[0][1], parts[1][1])
    num = torch.zeros((N, Hkv, G, D), device=q.device, dtype=torch.float32)
    den = torch.zeros((N, Hkv, G), device=q.device, dtype=torch.float32)
    for o_x, lse_x in parts:
        w = torch.exp(lse_x - m)                          # an empty part: exp(-inf) = 0
        num += w[..., None] * o_x
        den += w
    return (num / den[..., None]).to(q.dtype).reshape(N, Hq, D)
