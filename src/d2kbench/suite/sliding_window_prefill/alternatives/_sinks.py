"""Folding per-head attention sinks into an attention result computed without them.

A sink logit ``s_h`` adds ``exp(s_h)`` to a row's softmax denominator and nothing to its
numerator. Given the sink-free output ``o`` and natural-log LSE ``lse`` of a row::

    lse_sink = logaddexp(lse, s_h)
    o_sink   = o * exp(lse - lse_sink) = o * sigmoid(lse - s_h)

(exact; ``s_h = -inf`` leaves both unchanged). This is how a library kernel without sink
support serves gpt-oss: two elementwise passes after the attention call.
"""

from __future__ import annotations

import torch


def fold_sinks(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply sinks to ``o [B, S, Hq, D]`` and ``lse [B, Hq, S]`` (float32, natural log).

    Returns:
        ``(o with the sinks, in o's dtype; lse with the sinks, float32)``; the inputs unchanged
        when every sink is -inf (one host read of the sinks: the passes are skipped).
    """
    if bool(torch.isneginf(sinks).all()):
        return o, lse.float()
    s = sinks.float().view(1, -1, 1)
    lse_sink = torch.logaddexp(lse.float(), s)
    w = torch.exp(lse.float() - lse_sink)                     # [B, Hq, S]
    o = (o.float() * w.transpose(1, 2)[..., None]).to(o.dtype)
    return o, lse_sink
