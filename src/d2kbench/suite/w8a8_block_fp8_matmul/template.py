"""Solution template for w8a8_block_fp8_matmul. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call; it times ``run`` with CUDA events (the decode workload in a CUDA graph).
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(A: torch.Tensor, As: torch.Tensor, B: torch.Tensor, Bs: torch.Tensor) -> torch.Tensor:
    """Block-scaled FP8 GEMM C = (A * As) @ (B * Bs)^T.

    Args:
        A: [M, K] float8_e4m3fn activations (float16 carrier on some CPU smoke runs), K-contiguous;
            K a multiple of 128. Never modify it.
        As: [M, K // 128] float32, one scale per row and 128-wide K block.
        B: [N, K] float8_e4m3fn weights (or the float16 carrier), K-contiguous.
        Bs: [ceil(N / 128), K // 128] float32, one scale per 128 x 128 weight block.

    Returns:
        C [M, N] bfloat16 (float16 when A is float16), contiguous.
    """
    raise NotImplementedError("implement run() with Triton kernels")
