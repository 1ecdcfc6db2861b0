"""Alternative ``dequant_cublas``: dequantise the AWQ weight with PyTorch, then a cuBLAS GEMM.

What a user without an int4 kernel runs: unpack the 4-bit fields with integer tensor ops,
``W = fp16((q - z) * s)`` (exactly the task's weight), then one fp16 GEMM. On CUDA the GEMM is
``torch.mm(x, W, out_dtype=torch.float32)`` (cuBLAS with FP32 accumulation and an FP32 result,
so no reduced-precision split-K reduction enters y) rounded to fp16 once; where that
overload is missing (CPU builds) the fp16 operands are multiplied in FP32.

It moves the weight several times per call (the int32 words, the unpacked codes, the fp16
W, which is 4x the 4-bit bytes), so at decode it is far from the HBM bound; it is the
speed a user gets without the fused dequantisation. cuBLAS on a W dequantised once ahead of
time would be faster but is not a valid comparator here: the harness draws fresh weights
for every call.

No host data enters the call (no tensor built from Python values, no host read of a device
value): the call is capturable in the CUDA graphs the harness times decode workloads with.
"""

from __future__ import annotations

import torch

_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _unpack(words: torch.Tensor) -> torch.Tensor:
    """``[R, N/8]`` int32 AWQ words -> ``[R, N]`` int32 codes 0..15.

    Column ``c`` of a group of 8 is the nibble at bits ``4 * _ORDER.index(c)``: the shifts are
    Python ints, so no index tensor is built from host data. (A ``torch.tensor(..., device=cuda)``
    here is a host-to-device copy, which fails inside the CUDA-graph capture the harness times
    decode workloads with: "Cannot copy between CPU and CUDA tensors during CUDA graph capture".)
    """
    R, P = words.shape
    cols = [(words >> (4 * _ORDER.index(c))) & 0xF for c in range(8)]          # in column order
    return torch.stack(cols, dim=-1).reshape(R, P * 8)


def run(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
        group_size: int) -> torch.Tensor:
    """``y [M, N]`` fp16 = x @ W with W dequantised by PyTorch ops (see the module docstring).

    Args:
        x: ``[M, K]`` float16.
        qweight: ``[K, N/8]`` int32; qzeros: ``[K/G, N/8]`` int32; scales: ``[K/G, N]`` float16.
        group_size: G.
    """
    q = _unpack(qweight)
    z = _unpack(qzeros).repeat_interleave(group_size, dim=0)
    W = ((q - z).to(torch.float32) * scales.to(torch.float32).repeat_interleave(group_size, dim=0)).to(torch.float16)
    if x.is_cuda:
        try:
            return torch.mm(x, W, out_dtype=torch.float32).to(torch.float16)
        except (RuntimeError, TypeError):
            pass
    return (x.float() @ W.float()).to(torch.float16)
