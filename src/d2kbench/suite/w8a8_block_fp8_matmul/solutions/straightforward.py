"""Block-scaled FP8 GEMM, straightforward Triton port (no expert design).

The direct translation of the widely used Triton kernel with its default configuration (the
one vLLM and SGLang fall back to when no tuned table exists for a shape): one program per
64 x 128 output tile in grouped order, pointer-based loads of A [64, 128] and of B^T
[128, 128] per K block, ``acc += dot(a, b) * As[:, None] * Bs[None, :]`` with the weight
scales gathered per output column (``n // 128``), 4 warps, 2 pipeline stages, and the same
tile for every shape (no split-K, no regime switch).
Shapes: ``A [M, K]`` e4m3, ``As [M, K/128]``, ``B [N, K]`` e4m3, ``Bs [ceil(N/128), K/128]`` ->
``C [M, N]`` bf16 (float16 for float16 carriers on CPU smoke runs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _w8a8_block_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                       stride_as, stride_bs, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       GROUP_M: tl.constexpr):
    """Program ``pid``: output tile (pid_m, pid_n) over all of K."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % rows
    pid_n = (pid % width) // rows

    offs_am = (pid_m * BM + tl.arange(0, BM)) % M
    offs_bn = (pid_n * BN + tl.arange(0, BN)) % N
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_am[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_bn[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + offs_am * stride_as
    bs_ptrs = bs_ptr + (offs_bn // BK) * stride_bs

    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        a_s = tl.load(as_ptrs + kb)
        b_s = tl.load(bs_ptrs + kb)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BK
        b_ptrs += BK

    offs_cm = pid_m * BM + tl.arange(0, BM)
    offs_cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + offs_cm[:, None].to(tl.int64) * stride_cm + offs_cn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def run(A: torch.Tensor, As: torch.Tensor, B: torch.Tensor, Bs: torch.Tensor) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``C [M, N] = (A * As) @ (B * Bs)^T`` with 128-wide scale groups."""
    M, K = A.shape
    N = B.shape[0]
    A, B, As, Bs = A.contiguous(), B.contiguous(), As.contiguous(), Bs.contiguous()
    c = torch.empty((M, N), dtype=torch.bfloat16 if A.dtype == torch.float8_e4m3fn else A.dtype, device=A.device)
    BM, BN, BK = 64, 128, 128
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _w8a8_block_kernel[grid](A, B, c, As, Bs, M, N, K, A.stride(0), B.stride(0), c.stride(0), As.stride(0),
                             Bs.stride(0), BM=BM, BN=BN, BK=BK, GROUP_M=32, num_warps=4, num_stages=2)
    return c
