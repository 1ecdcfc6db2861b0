"""Alternative ``flashinfer_window``: FlashInfer's batch prefill with its sliding window and
logit soft-cap, ``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` over the batch as B packed
sequences of S tokens.

* ``plan(indptr, indptr, Hq, Hkv, D, causal=True, window_left=W - 1, logits_soft_cap=c or
  None, sm_scale=scale, ...)`` (FlashInfer's ``window_left`` counts the keys left of the query:
  W - 1), then ``run(q, k, v, return_lse=True)`` on the ``[B * S, H, D]`` views; ``plan`` runs
  every call (the timed figure includes it).
* LSE: FlashInfer returns ``[B * S, Hq]`` float32 in base 2: converted to natural log
  ``[B, Hq, S]``.
* Sinks folded in from the LSE (:mod:`_sinks`), as for a FlashInfer build without sink support.

The package is imported inside ``run`` (declared for ``cuda`` only): without it the call fails
with a message naming the package. The workspace and wrapper are kept per device.
"""

from __future__ import annotations

import math

import torch

from d2kbench.suite.sliding_window_prefill.alternatives._sinks import fold_sinks

WORKSPACE_BYTES = 128 << 20
_WRAPPERS: dict = {}


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window attention with FlashInfer, sinks folded in from the LSE.

    Returns:
        ``(o [B, S, Hq, D] in q's dtype, lse [B, Hq, S] float32, natural log)``.

    Raises:
        RuntimeError: flashinfer is not installed, or it rejects the inputs.
    """
    try:
        import flashinfer
    except ImportError as e:
        raise RuntimeError("alternative flashinfer_window needs the flashinfer package "
                           "(pip install flashinfer-python; it JIT-compiles its kernels with nvcc)") from e
    if q.device not in _WRAPPERS:
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        _WRAPPERS[q.device] = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    wrapper = _WRAPPERS[q.device]
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    indptr = torch.arange(B + 1, device=q.device, dtype=torch.int32) * S
    W = min(int(window), S)
    wrapper.plan(indptr, indptr, Hq, Hkv, D, causal=True, window_left=W - 1 if W < S else -1,
                 logits_soft_cap=float(softcap) if softcap > 0 else None, sm_scale=scale,
                 q_data_type=q.dtype, kv_data_type=k.dtype)
    o, lse2 = wrapper.run(q.reshape(B * S, Hq, D), k.reshape(B * S, Hkv, D), v.reshape(B * S, Hkv, D),
                          return_lse=True)
    lse = (lse2.float() * math.log(2.0)).view(B, S, Hq).transpose(1, 2)
    o, lse = fold_sinks(o.view(B, S, Hq, D), lse, sinks)
    return o.contiguous(), lse.contiguous()
