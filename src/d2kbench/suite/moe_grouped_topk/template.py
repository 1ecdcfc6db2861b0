"""Solution template for moe_grouped_topk. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics and the property check). The harness imports this file in a separate process and
calls ``run`` with fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(router_logits: torch.Tensor, e_score_correction_bias: torch.Tensor, top_k: int,
        num_expert_group: int, topk_group: int, routed_scaling_factor: float):
    """Grouped top-k routing with a correction bias.

    Args:
        router_logits: [T, E] float32, contiguous.
        e_score_correction_bias: [E] float32.
        top_k: experts per token k.
        num_expert_group: groups G (E % G == 0; 1: no group stage).
        topk_group: surviving groups.
        routed_scaling_factor: multiplies the renormalised weights.
        None of the inputs may be modified.

    Returns:
        (topk_weights [T, k] float32, topk_ids [T, k] int32), new row-major tensors.
    """
    raise NotImplementedError("implement run() with Triton kernels")
