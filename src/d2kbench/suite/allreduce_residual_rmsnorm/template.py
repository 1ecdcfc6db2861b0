"""Solution template for allreduce_residual_rmsnorm. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification: the rank-order FP32 sum, the in-place residual update, the
bf16 and FP8 outputs), requirements.md (the rules) and reference.py (the semantics). The harness
imports this file in a separate process and calls ``run`` with fresh inputs on every call.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(partials: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
        quant: int):
    """Sum of R tensor-parallel partial outputs + residual add + RMSNorm (+ FP8 group quantisation).

    Args:
        partials: a list of R (1..8) tensors [T, H] bfloat16 (float16 on the CPU smoke runs), the
            ranks' partial outputs in rank order, each its own allocation; never modify them.
        residual: [T, H] same dtype; overwrite it in place with bf16(bf16(sum) + residual).
        weight: [H] same dtype, the RMSNorm gain.
        eps: RMSNorm epsilon.
        group_size: columns per quantisation group (128); H is a multiple of it.
        quant: 1 for FP8 e4m3 codes with one float32 scale per (row, group), 0 for a bf16 output.

    Returns:
        (y [T, H] row-major: bfloat16 when quant = 0, float8_e4m3fn when quant = 1 (the input
         dtype on float16 smoke runs),
         y_s [T, H // group_size] float32 row-major when quant = 1, an empty [T, 0] float32
         tensor when quant = 0).
    """
    raise NotImplementedError("implement run() with Triton kernels")
