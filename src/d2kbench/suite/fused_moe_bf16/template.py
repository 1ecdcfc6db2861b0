"""Solution template for fused_moe_bf16. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """Fused MoE expert layer after routing.

    Args:
        x: [T, H] bfloat16 (float16 on CPU smoke workloads), contiguous.
        w13: [E, 2I, H], gate rows then up rows of every expert.
        w2: [E, H, I].
        topk_weights: [T, k] float32.
        topk_ids: [T, k] int32, values in [0, E).
        None of the inputs may be modified.

    Returns:
        [T, H] in x's dtype, a new tensor.
    """
    raise NotImplementedError("implement run() with Triton kernels")
