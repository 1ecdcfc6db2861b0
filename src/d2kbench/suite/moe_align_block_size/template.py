"""Solution template for moe_align_block_size. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics and the property check). The harness imports this file in a separate process and
calls ``run`` with fresh inputs on every call; it times ``run`` inside a CUDA graph.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(topk_ids: torch.Tensor, block_size: int, num_experts: int):
    """Group token-to-expert assignments into block-padded expert segments.

    Args:
        topk_ids: [T, k] int32, contiguous, values in [0, num_experts). Never modify it.
        block_size: B, the row-block size of the consuming grouped GEMM.
        num_experts: E.

    Returns:
        (sorted_token_ids, expert_ids, num_tokens_post_padded): new int32 tensors of shapes
        [T*k + E*(B-1)], [ceil((T*k + E*(B-1)) / B)] and [1] (see task.yaml).
    """
    raise NotImplementedError("implement run() with Triton kernels")
