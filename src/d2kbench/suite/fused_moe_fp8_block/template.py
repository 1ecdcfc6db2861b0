"""Solution template for fused_moe_fp8_block. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Block-FP8 (W8A8) fused MoE expert layer after routing.

    Args:
        x: [T, H] bfloat16, contiguous.
        w13: [E, 2I, H] float8_e4m3fn, gate rows then up rows of every expert.
        w13_scale: [E, 2I/128, H/128] float32, one scale per 128 x 128 block.
        w2: [E, H, I] float8_e4m3fn.
        w2_scale: [E, H/128, I/128] float32.
        topk_weights: [T, k] float32.
        topk_ids: [T, k] int32, values in [0, E).
        None of the inputs may be modified.

    Returns:
        [T, H] bfloat16, a new tensor.
    """
    raise NotImplementedError("implement run() with Triton kernels")
