"""Alternative ``flex_window``: PyTorch's ``flex_attention``, compiled, with a sliding-window
block mask and a soft-cap ``score_mod``: PyTorch's own route to windowed, soft-capped attention
(its Triton template skips the key blocks the block mask marks empty, i.e. the tiles outside
the band).

* ``create_block_mask(mask_mod, None, None, S, S)`` with ``mask_mod = (j <= i) & (j > i - W)``,
  kept per ``(S, W, device)`` (it depends on shapes only; the score_mod is kept per cap value);
* ``score_mod = c * tanh(x / c)`` when ``softcap > 0`` (x already scaled);
* ``enable_gqa=True`` (query head ``h`` reads KV head ``h // G``), the LSE requested
  (``return_aux=AuxRequest(lse=True)``, or ``return_lse=True`` before torch 2.9; natural log,
  ``[B, Hq, S]``); ``flex_attention`` wrapped in ``torch.compile`` once per process;
* sinks folded in from the LSE (:mod:`_sinks`).

Declared for ``cuda`` only (on the CPU flex_attention runs its unfused reference path). The
tests call :func:`run` on CPU tensors directly (uncompiled) to check the masks and the folding.
"""

from __future__ import annotations

import torch

from d2kbench.suite.sliding_window_prefill.alternatives._sinks import fold_sinks

_BLOCK_MASKS: dict = {}
_COMPILED: dict = {}
_SCORE_MODS: dict = {}


def _score_mod(cap: float):
    """The soft-cap ``score_mod`` for ``cap`` (None: no cap), one function object per value, so
    that the compiled flex_attention is not re-traced on every call."""
    if cap <= 0:
        return None
    if cap not in _SCORE_MODS:
        def softcap(x, b, h, i, j):
            return cap * torch.tanh(x / cap)

        _SCORE_MODS[cap] = softcap
    return _SCORE_MODS[cap]


def _flex():
    from torch.nn.attention.flex_attention import flex_attention

    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["fn"]


def _flex_unfused(*args, **kwargs):
    """flex_attention's unfused path, chosen explicitly (the CPU stand-in of the tests): compiled
    flex_attention on the CPU cannot return the LSE (torch 2.13: "torch.compile on CPU only supports
    inference and `return_lse` is not supported yet"), and calling it uncompiled warns that the
    scores are materialised, which is the point here. torch's documented switch for running
    flex_attention without compiling it (``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``) is set for
    this call only."""
    import torch.nn.attention.flex_attention as flex

    before = getattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)
    flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        return flex.flex_attention(*args, **kwargs)
    finally:
        flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = before


def _block_mask(S: int, W: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    key = (S, W, str(device))
    if key not in _BLOCK_MASKS:
        def band(b, h, i, j):
            return (j <= i) & (j > i - W)

        _BLOCK_MASKS[key] = create_block_mask(band, None, None, S, S, device=device)
    return _BLOCK_MASKS[key]


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window attention with compiled flex_attention, sinks folded in from the LSE.

    Returns:
        ``(o [B, S, Hq, D] in q's dtype, lse [B, Hq, S] float32)``, new contiguous tensors.
    """
    B, S, Hq, _ = q.shape
    fn = _flex() if q.is_cuda else _flex_unfused
    import torch.nn.attention.flex_attention as flex

    kw = dict(score_mod=_score_mod(float(softcap)), block_mask=_block_mask(S, min(int(window), S), q.device),
              scale=scale, enable_gqa=True)
    if hasattr(flex, "AuxRequest"):      # torch >= 2.9: return_lse is deprecated
        o, aux = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), return_aux=flex.AuxRequest(lse=True), **kw)
        lse = aux.lse
    else:
        o, lse = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), return_lse=True, **kw)
    o, lse = fold_sinks(o.transpose(1, 2), lse, sinks)
    return o.contiguous(), lse.contiguous()
