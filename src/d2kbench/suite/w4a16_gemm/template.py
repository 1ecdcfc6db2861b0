"""Solution template for w4a16_gemm. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification, including the AWQ packing order), requirements.md (the
rules) and reference.py (the semantics). The harness imports this file in a separate process
and calls ``run`` with fresh inputs on every call; it times the decode workloads in a CUDA
graph and the prefill workload with CUDA events.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
        group_size: int) -> torch.Tensor:
    """AWQ W4A16 GEMM y = x @ W, W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].

    Args:
        x: [M, K] float16, contiguous. Never modify it.
        qweight: [K, N // 8] int32, 8 four-bit codes per word in AWQ order [0, 2, 4, 6, 1, 3, 5, 7].
        qzeros: [K // G, N // 8] int32, the zero points packed the same way.
        scales: [K // G, N] float16.
        group_size: G (128); K is a multiple of it, N a multiple of 8.

    Returns:
        y [M, N] float16, contiguous.
    """
    raise NotImplementedError("implement run() with Triton kernels")
