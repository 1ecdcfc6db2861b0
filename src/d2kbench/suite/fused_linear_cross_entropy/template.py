"""Solution template for fused_linear_cross_entropy. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Mean cross-entropy of the LM head and its gradients, without materialising the logits.

    Args:
        x: [BT, H] bfloat16 hidden states.
        weight: [V, H] bfloat16 LM-head weight.
        labels: [BT] int64 device tensor, in [0, V) or ignore_index.
        ignore_index: -100.

    Returns:
        (loss, dX, dW): loss a float32 scalar (shape []), dX [BT, H] bfloat16, dW [V, H]
        float32, all new contiguous tensors. Extra device memory (peak minus the outputs) at
        most 1 GiB; never read labels on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
