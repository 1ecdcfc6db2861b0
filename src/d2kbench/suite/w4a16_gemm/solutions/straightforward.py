"""AWQ W4A16 GEMM, straightforward Triton port (no expert design).

The direct translation of the reference into one tiled GEMM kernel: each program owns a
tile of y (16-64 rows x 64 columns), walks K in steps of 128 (one quantisation group), loads
the packed codes of its columns, unpacks each column's 4-bit field with a shift and a mask
(AWQ's field order), subtracts the zero point as an integer, converts to float, multiplies by
the scale, rounds the weight to fp16 and multiplies on the tensor cores with an FP32
accumulator. The same tile for every shape, one program per output tile (no split-K).
Shapes: ``x [M, K]`` fp16, ``qweight [K, N/8]``, ``qzeros [K/G, N/8]`` int32,
``scales [K/G, N]`` fp16 -> ``y [M, N]`` fp16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _awq_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_qk, stride_zg, stride_sg, stride_ym,
                G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (pid_m, pid_n): one BM x BN tile of y over all of K."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    n_ok = offs_n < N
    c = offs_n % 8
    shifts = ((c % 2) * 4 + c // 2) * 4        # AWQ order [0, 2, 4, 6, 1, 3, 5, 7] inverted
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        g = k // G
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k + offs_k)[None, :],
                    mask=m_ok[:, None], other=0.0)
        words = tl.load(qw_ptr + (k + offs_k)[:, None].to(tl.int64) * stride_qk + (offs_n // 8)[None, :],
                        mask=n_ok[None, :], other=0)
        zw = tl.load(qz_ptr + g * stride_zg + offs_n // 8, mask=n_ok, other=0)
        s = tl.load(s_ptr + g * stride_sg + offs_n, mask=n_ok, other=0.0)
        q = (words >> shifts[None, :]) & 0xF
        z = (zw >> shifts) & 0xF
        w = ((q - z[None, :]).to(tl.float32) * s[None, :].to(tl.float32)).to(tl.float16)
        acc += tl.dot(x, w)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], acc.to(tl.float16),
             mask=m_ok[:, None] & n_ok[None, :])


def run(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
        group_size: int) -> torch.Tensor:
    """AWQ W4A16 GEMM ``y [M, N] = x @ ((q - z) * s)`` with FP32 accumulation."""
    M, K = x.shape
    N = scales.shape[1]
    x, qweight, qzeros, scales = x.contiguous(), qweight.contiguous(), qzeros.contiguous(), scales.contiguous()
    y = torch.empty((M, N), dtype=torch.float16, device=x.device)
    BM, BN, BK = max(16, min(64, triton.next_power_of_2(M))), 64, group_size
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _awq_kernel[grid](x, qweight, qzeros, scales, y, M, N, K, x.stride(0), qweight.stride(0), qzeros.stride(0),
                      scales.stride(0), y.stride(0), G=group_size, BM=BM, BN=BN, BK=BK, num_warps=4)
    return y
