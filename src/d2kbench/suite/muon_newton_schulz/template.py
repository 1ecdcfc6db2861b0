"""Solution template for muon_newton_schulz. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Muon orthogonalisation.

    Args:
        G: [B, M, N] bfloat16, contiguous. Never modify it.
        steps: always 5.

    Returns:
        [B, M, N] bfloat16, a new tensor.
    """
    raise NotImplementedError("implement run() with Triton kernels")
