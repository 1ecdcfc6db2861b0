"""Solution template for flash_decode_splitkv. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call; the registered workloads are timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a contiguous per-sequence KV cache, with the log-sum-exp.

    Args:
        q: [B, Hq, D] bfloat16 (float16 on CPU smoke workloads).
        k_cache, v_cache: [B, LMAX, Hkv, D], q's dtype; sequence b's tokens are rows
            0 .. cache_seqlens[b]-1 of slot b, every later row is NaN. Query head h reads KV
            head h // (Hq // Hkv).
        cache_seqlens: [B] int32 device tensor, 1 <= cache_seqlens[b] <= LMAX.
        scale: softmax scale.

    Returns:
        (o, lse): o [B, Hq, D] in q's dtype; lse [B, Hq] float32, natural log of each row's
        softmax denominator. New tensors. Never modify the inputs; never read cache_seqlens on
        the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
