"""Solution template for sliding_window_prefill. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, scale: float, window: int,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window causal GQA attention forward with attention sinks and logit soft-capping.

    Args:
        q: [B, S, Hq, D] bfloat16 (float16 on CPU smoke workloads), contiguous BSHD.
        k, v: [B, S, Hkv, D], q's dtype; query head h uses KV head h // (Hq // Hkv).
        sinks: [Hq] float32 per-head sink logits joining the softmax denominator (-inf: no sink).
        scale: softmax scale applied to q.k.
        window: W >= 1; query i sees keys i - W < j <= i (W keys, its own included).
        softcap: logit cap c (scores become c * tanh(scale q.k / c)); 0.0 means no cap.

    Returns:
        (o, lse): o [B, S, Hq, D] in q's dtype; lse [B, Hq, S] float32, the natural log of each
        row's softmax denominator including exp(sinks[h]). Both new tensors.
    """
    raise NotImplementedError("implement run() with Triton kernels")
