"""Solution template for lora_shrink_expand. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call; the calls are timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
        token_lora_mapping: torch.Tensor, scale: float) -> None:
    """Multi-LoRA shrink and expand, added into y in place.

    Args:
        x: [T, K] bfloat16, the projection's input rows.
        y: [T, N] bfloat16, the base output; for every token t with l = token_lora_mapping[t] >= 0
            and every column n of slice s, add scale * (x[t] @ lora_a[s, l].T) @ lora_b[l, n] in
            place (FP32 accumulation, rounded to bf16 once); rows with l = -1 stay bit-identical.
        lora_a: [S, L, R, K] bfloat16 shrink weights (K-contiguous).
        lora_b: [L, N, R] bfloat16 expand weights of all slices, concatenated along N.
        slice_offsets: [S + 1] int32 device tensor: slice s owns columns [o_s, o_{s+1}).
        token_lora_mapping: [T] int32 device tensor in [-1, L).
        scale: the LoRA scaling (alpha / r).

    Returns:
        None. Never read token_lora_mapping or slice_offsets on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
