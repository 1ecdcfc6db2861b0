"""Alternative ``flashinfer_ragged``: FlashInfer's batch prefill over a ragged (packed) K/V,
``flashinfer.BatchPrefillWithRaggedKVCacheWrapper``, the library kernel SGLang and vLLM call
for a prefill batch without a prefix cache.

* ``plan(cu_seqlens, cu_seqlens, Hq, Hkv, D, causal=True, sm_scale=scale, q_data_type=...)``
  then ``run(q, k, v, return_lse=True)``. ``plan`` reads the offsets on the host and builds
  FlashInfer's own work partition; it runs on every call here, because the lengths change on
  every call (a model amortises one plan over its layers; the timed figure includes it).
* GQA: FlashInfer maps query head ``h`` to KV head ``h // G``.
* LSE: FlashInfer returns ``[T, Hq]`` float32 in base 2 (its kernels keep the running max in
  ``log2`` units): converted to the task's natural-log ``[Hq, T]``.

The package is imported inside ``run`` (declared for ``cuda`` only): without it the call fails
with a message naming the package. The workspace buffer and the wrapper are kept per device
(they hold no input-derived values between calls; ``plan`` overwrites them).
"""

from __future__ import annotations

import math

import torch

#: FlashInfer's float workspace (its examples use 128 MB).
WORKSPACE_BYTES = 128 << 20
_WRAPPERS: dict = {}


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen causal GQA attention with FlashInfer's ragged prefill.

    Args:
        q: ``[T, Hq, D]`` bf16; k, v: ``[T, Hkv, D]``; cu_seqlens: ``[N + 1]`` int32 (device);
        max_seqlen: host int (unused by FlashInfer); scale: softmax scale.

    Returns:
        ``(o [T, Hq, D] in q's dtype, lse [Hq, T] float32, natural log)``.

    Raises:
        RuntimeError: flashinfer is not installed, or it rejects the inputs.
    """
    try:
        import flashinfer
    except ImportError as e:
        raise RuntimeError("alternative flashinfer_ragged needs the flashinfer package "
                           "(pip install flashinfer-python; it JIT-compiles its kernels with nvcc)") from e
    key = q.device
    if key not in _WRAPPERS:
        ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        _WRAPPERS[key] = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    wrapper = _WRAPPERS[key]
    T, Hq, D = q.shape
    wrapper.plan(cu_seqlens, cu_seqlens, Hq, k.shape[1], D, causal=True, sm_scale=scale,
                 q_data_type=q.dtype, kv_data_type=k.dtype)
    o, lse2 = wrapper.run(q, k, v, return_lse=True)
    return o.contiguous(), (lse2.float().t() * math.log(2.0)).contiguous()
