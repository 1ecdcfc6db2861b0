"""Solution template for topk_topp_sampling. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics and the property check). The harness imports this file in a separate process and
calls ``run`` with fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
        uniforms: torch.Tensor) -> torch.Tensor:
    """Sample one token id per request with temperature, top-k and top-p.

    Args:
        logits: [B, V] float32, contiguous rows (-inf marks masked tokens).
        temperature: [B] float32, > 0.
        top_k: [B] int32 in [1, V] (V: no top-k).
        top_p: [B] float32 in (0, 1] (1: no top-p).
        uniforms: [B] float32 in [0, 1): the random number of each request.
        None of the inputs may be modified.

    Returns:
        ids [B] int64, a new tensor: the inverse-CDF pick of uniforms[b] over the kept tokens of
        row b in vocabulary order (task.yaml, reference.run).
    """
    raise NotImplementedError("implement run() with Triton kernels")
