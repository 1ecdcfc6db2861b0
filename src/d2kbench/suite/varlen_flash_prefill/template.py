"""Solution template for varlen_flash_prefill. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed variable-length causal GQA attention forward.

    Args:
        q: [T, Hq, D] bfloat16 (float16 on CPU smoke workloads); N sequences packed back to back.
        k, v: [T, Hkv, D], q's dtype; query head h uses KV head h // (Hq // Hkv).
        cu_seqlens: [N + 1] int32 device tensor, sequence s owns rows cu_seqlens[s] .. cu_seqlens[s+1]-1.
        max_seqlen: the longest sequence's length (host int).
        scale: softmax scale (1/sqrt(D)).

    Returns:
        (o, lse): o [T, Hq, D] in q's dtype; lse [Hq, T] float32, the natural log of each row's
        softmax denominator. Both new tensors; never modify the inputs.
    """
    raise NotImplementedError("implement run() with Triton kernels")
