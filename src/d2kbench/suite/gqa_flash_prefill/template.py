"""Solution template for gqa_flash_prefill. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention forward.

    Args:
        q: [B, S, Hq, D] bfloat16 (float16 on CPU smoke workloads), contiguous BSHD.
        k, v: [B, S, Hkv, D], q's dtype, contiguous; query head h uses KV head h // (Hq // Hkv).
        scale: softmax scale (1/sqrt(D)).

    Returns:
        (o, lse): o [B, S, Hq, D] in q's dtype; lse [B, Hq, S] float32, the natural log of each
        row's softmax denominator. Both new tensors; never modify q, k or v.
    """
    raise NotImplementedError("implement run() with Triton kernels")
