"""Solution template for per_token_group_quant_fp8. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification, including the required scale layouts), requirements.md
(the rules) and reference.py (the semantics). The harness imports this file in a separate
process and calls ``run`` with fresh inputs on every call; it times ``run`` in a CUDA graph.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, group_size: int, column_major_scales: bool, scale_ue8m0: bool):
    """Per-token-group FP8 quantisation.

    Args:
        x: [M, K] bfloat16, contiguous; K a multiple of group_size. Never modify it.
        group_size: elements per group (128).
        column_major_scales: x_s column-major with strides (1, 4 * ceil(M / 4)).
        scale_ue8m0: round scales up to powers of two.

    Returns:
        (x_q [M, K] float8_e4m3fn row-major, x_s [M, K // group_size] float32 in the layout asked for).
    """
    raise NotImplementedError("implement run() with Triton kernels")
