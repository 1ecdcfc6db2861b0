"""Alternative ``scaled_mm_blockwise``: ``torch._scaled_mm`` with DeepSeek-style block scales.

What a user would run instead of writing the kernel: since CUDA 12.9, cuBLASLt implements
FP8 GEMMs with 1 x 128 scales on the left operand and 128 x 128 block scales on the right one
on sm_90, and PyTorch's ``_scaled_mm`` dispatches to it when the scale shapes say so
(``scale_a [M, K/128]``, ``scale_b [K/128, ceil(N/128)]``, bf16 output, no fast accumulation:
the library promotes the partial sums itself).

Layouts cuBLASLt expects:

* ``mat_b`` is ``B^T`` as a column-major ``[K, N]`` view of the ``[N, K]`` weights (no copy);
* ``scale_a`` must be outer-dimension-major (M-major: stride ``(1, M)``), so the row-major
  ``As`` of the task is transposed once per call (``M * K/128 * 4`` bytes, e.g. 0.5 MB at
  M = 4096, K = 16384: a small copy next to the GEMM);
* ``scale_b`` is ``Bs^T``, a ``[K/128, ceil(N/128)]`` view (no copy).

CUDA only (``task.yaml`` declares ``devices: [cuda]``); on older CUDA builds or other GPUs
``_scaled_mm`` raises, and the alternative is reported as failed rather than replaced.
"""

from __future__ import annotations

import torch


def run(A: torch.Tensor, As: torch.Tensor, B: torch.Tensor, Bs: torch.Tensor) -> torch.Tensor:
    """Block-scaled FP8 GEMM through cuBLASLt.

    Args:
        A: ``[M, K]`` float8_e4m3fn, K-contiguous.
        As: ``[M, K/128]`` float32 row-major activation scales.
        B: ``[N, K]`` float8_e4m3fn, K-contiguous.
        Bs: ``[ceil(N/128), K/128]`` float32 weight block scales.

    Returns:
        ``C [M, N]`` bfloat16, contiguous.

    Raises:
        RuntimeError: the CUDA build or GPU has no blockwise FP8 scaling.
    """
    M = A.shape[0]
    pad = -M % 16  # cuBLASLt's blockwise scaling has no heuristic for M not a multiple of 16: pad, as users do
    if pad:
        A = torch.cat([A, A.new_zeros(pad, A.shape[1])])
        As = torch.cat([As, As.new_ones(pad, As.shape[1])])
    scale_a = As.t().contiguous().t()   # M-major [M, K/128]
    C = torch._scaled_mm(A, B.t(), scale_a, Bs.t(), out_dtype=torch.bfloat16, use_fast_accum=False)
    return C[:M].contiguous() if pad else C
