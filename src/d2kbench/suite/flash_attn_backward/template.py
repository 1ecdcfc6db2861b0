"""Solution template for flash_attn_backward. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
        do: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal GQA attention backward.

    Args:
        q: [B, S, Hq, D] bfloat16 (float16 on CPU smoke workloads), contiguous BSHD.
        k, v: [B, S, Hkv, D], q's dtype, contiguous; query head h uses KV head h // (Hq // Hkv).
        o: [B, S, Hq, D], the forward's output, q's dtype.
        lse: [B, Hq, S] float32, the forward's natural-log softmax denominator of each row.
        do: [B, S, Hq, D], the gradient of the loss with respect to o, q's dtype.
        scale: softmax scale (1/sqrt(D)).

    Returns:
        (dq, dk, dv): dq [B, S, Hq, D], dk and dv [B, S, Hkv, D] (summed over the query heads
        of each KV head), all in q's dtype, new tensors; never modify the inputs.
    """
    raise NotImplementedError("implement run() with Triton kernels")
