"""Alternative ``sdpa_band_mask``: SDPA's memory-efficient backend with an explicit additive band
mask, ``torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, 0.0, False,
scale=scale)`` (the ATen op behind ``F.scaled_dot_product_attention`` with an ``attn_mask``,
returning the LSE).

* The mask is a ``[S, S]`` tensor in q's dtype, 0 inside the band and -inf outside, broadcast
  over batch and heads. Its rows are stored with a stride rounded up to a multiple of 8 elements
  (a ``[S, S8]`` allocation cut to ``[S, S]``), the alignment the memory-efficient kernel requires
  of ``attn_bias`` (``F.scaled_dot_product_attention`` pads the same way). It depends on ``(S, W)`` only and is kept per shape; the kernel still
  visits every key tile (the mask is data to it): the work of full non-causal attention.
* GQA: the memory-efficient kernel takes equal head counts, so K and V are expanded to ``Hq``
  heads (``repeat_interleave``: head ``h`` gets KV head ``h // G``), inside the timed call.
* LSE: float32 ``[B, Hq, S']`` (``S'`` padded to the kernel's alignment), natural log, cut to S.
* Sinks folded in from the LSE (:mod:`_sinks`). No soft-cap: a workload with ``softcap > 0`` is
  refused with a ValueError.

Device switch: declared for ``cuda`` only; on a CPU tensor the CPU flash kernel with the same
mask stands in (same contract), so that the tests check the mask, the expansion and the LSE.
"""

from __future__ import annotations

import torch

from d2kbench.suite.sliding_window_prefill.alternatives._sinks import fold_sinks

_MASKS: dict = {}


def _mask(S: int, W: int, dtype, device) -> torch.Tensor:
    key = (S, W, dtype, str(device))
    if key not in _MASKS:
        i = torch.arange(S, device=device)[:, None]
        j = torch.arange(S, device=device)[None, :]
        padded = torch.zeros((S, -(-S // 8) * 8), dtype=dtype, device=device)
        m = padded[:, :S]
        _MASKS[key] = m.masked_fill_(~((j <= i) & (j > i - W)), float("-inf"))
    return _MASKS[key]


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window attention as masked SDPA (memory-efficient backend), sinks from the LSE.

    Returns:
        ``(o [B, S, Hq, D] in q's dtype, lse [B, Hq, S] float32)``, new contiguous tensors.

    Raises:
        ValueError: ``softcap > 0`` (a mask cannot express a soft-cap).
        RuntimeError: the backend rejects the inputs.
    """
    if softcap > 0:
        raise ValueError("SDPA with an additive mask cannot express a logit soft-cap")
    B, S, Hq, _ = q.shape
    G = Hq // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(G, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(G, dim=2).transpose(1, 2)
    mask = _mask(S, int(window), q.dtype, q.device)
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            qt, kt, vt, mask.expand(B, Hq, S, S), True, 0.0, False, scale=scale)
    else:  # the CPU stand-in (see the module docstring)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qt, kt, vt, 0.0, False, attn_mask=mask,
                                                                          scale=scale)
    o, lse = fold_sinks(out[0].transpose(1, 2), out[1][:, :, :S], sinks)
    return o.contiguous(), lse.contiguous()
