"""Expert Triton solution: block-scaled FP8 GEMM (DeepSeek-V3 W8A8) with two-level accumulation.

Contract (identical to ``reference.run``)
------------------------------------------
``run(A, As, B, Bs)``: ``A [M, K]`` e4m3 with 1 x 128 group scales ``As [M, K/128]`` FP32,
``B [N, K]`` e4m3 with 128 x 128 block scales ``Bs [ceil(N/128), K/128]`` FP32 ->
``C [M, N] = sum_kb As[:, kb] * Bs[n // 128, kb] * (A_kb @ B_kb^T)`` in bfloat16 (float16
when the operands are carried in float16 on CPU smoke runs).

Design
------
L1 -- FP8 tensor cores, scales applied to partial products (two-level accumulation).
    The MMA consumes the FP8 codes directly (twice the 16-bit tensor-core rate, half the
    operand bytes); nothing is dequantised. Each 128-deep K block is one tensor-core product
    into a fresh accumulator (Hopper's FP8 MMA accumulates with reduced precision inside
    it), which is then promoted into the FP32 master accumulator with one multiply-add by the
    rank-1 factor ``As[m, kb] * Bs[nb, kb]``. BLOCK_K = 128 = the quantisation group, so a K
    step needs exactly one activation scale per row and one weight scale per tile.

L2 -- two regimes by the tile count.
    * Compute-bound (enough 128 x 128 output tiles to fill the SMs: the prefill shapes):
      128 x 128 tiles with two consumer warpgroups (8 warps: one warpgroup's promotion FMAs
      overlap the other's MMAs), 3-5 stage TMA pipelines (32 KB per stage), grouped
      rasterisation so that a group of M tiles reuses each B panel from L2.
    * Weight-streaming (M <= 64 or few tiles: the decode shapes): one M tile covers the batch, narrow N
      tiles and split-K multiply the number of programs so that every SM streams B with
      deep pipelines; FP32 partial sums meet in an FP32 workspace (relaxed atomics) and one
      small pass rounds it to bf16. B is read once from HBM in both regimes.
    The weight scale is a scalar per K step (BLOCK_N divides 128, so a tile never straddles
    two weight blocks; a ragged last N block uses its own scale row); the activation scales
    of a K step are one [BLOCK_M] vector; both stay in registers with the accumulator.

L3 -- TMA descriptors for A and B (out-of-range rows of a ragged M or N tile are zero-filled
    by the copy engine, so the main loop has no masks), the B tile consumed as its
    K-major transpose (what the FP8 MMA needs), an autotuned list of tile / warp / stage /
    split choices plausible for sm_90, and the promotion as a single FMA per accumulator
    element (the per-row factor ``As * Bs`` is formed once per K step).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GROUP = 128


def _num_sms(device: torch.device) -> int:
    """SMs of the GPU (132 on an H200); the CPU interpreter runs programs one after another,
    so a small count there keeps both regimes reachable on tiny shapes."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _set_block_shapes(nargs):
    """Autotuner pre-hook: the TMA descriptors' boxes follow the config's tile."""
    nargs["a_desc"].block_shape = [nargs["BM"], GROUP]
    nargs["b_desc"].block_shape = [nargs["BN"], GROUP]


@triton.jit
def _block_fp8_gemm(a_desc, b_desc, as_ptr, bs_ptr, c_ptr, M, N, KB, stride_as, stride_bs, stride_cm,
                    BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """One program: output tile (pid_m, pid_n), K blocks of split pid_k. SPLIT_K > 1 adds FP32
    partial sums into ``c_ptr`` (an FP32 workspace); SPLIT_K == 1 stores C directly."""
    BK: tl.constexpr = 128
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % rows
    pid_n = (pid % width) // rows
    per = tl.cdiv(KB, SPLIT_K)
    kb0 = pid_k * per
    kb1 = min(kb0 + per, KB)

    offs_m = pid_m * BM + tl.arange(0, BM)
    m_ok = offs_m < M
    sa_ptrs = as_ptr + offs_m.to(tl.int64) * stride_as
    sb_ptr = bs_ptr + ((pid_n * BN) // BK) * stride_bs    # BN divides 128: one weight block per tile
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(kb0, kb1):
        a = a_desc.load([pid_m * BM, kb * BK])
        b = b_desc.load([pid_n * BN, kb * BK])
        scale = tl.load(sa_ptrs + kb, mask=m_ok, other=0.0) * tl.load(sb_ptr + kb)
        acc += tl.dot(a, b.T) * scale[:, None]

    offs_n = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    c_ok = m_ok[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_ok)
    else:
        tl.atomic_add(c_ptrs, acc, mask=c_ok, sem="relaxed")


@triton.jit
def _round_out(ws_ptr, c_ptr, n, BLOCK: tl.constexpr):
    """C = round(FP32 workspace) for the split-K path (one pass over M x N)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(c_ptr + offs, tl.load(ws_ptr + offs, mask=ok).to(c_ptr.dtype.element_ty), mask=ok)


def _cfg(bm, bn, warps, stages, split=1):
    return triton.Config({"BM": bm, "BN": bn, "SPLIT_K": split}, num_warps=warps, num_stages=stages,
                         pre_hook=_set_block_shapes)


# Compute-bound tiles for sm_90: 128 x 128 with two consumer warpgroups first (32 KB of FP8 per
# stage), then single-warpgroup rectangles.
_COMPUTE = [_cfg(128, 128, 8, 4), _cfg(128, 128, 8, 3), _cfg(128, 128, 8, 5), _cfg(128, 64, 4, 5),
            _cfg(64, 128, 4, 5)]
# Weight streaming: BM is fixed by the batch (passed at call time); N width, split and depth tuned.
_STREAM = [triton.Config({"BN": bn, "SPLIT_K": s}, num_warps=4, num_stages=st, pre_hook=_set_block_shapes)
           for bn in (128, 64) for s in (4, 2, 8, 1) for st in (6, 4)]
if _INTERPRET:  # no timing under the CPU interpreter: one config each, no tuning runs
    _COMPUTE, _STREAM = _COMPUTE[:1], _STREAM[:1]

SMEM_BUDGET = 220 * 1024   # of the 227 KB an sm_90 block may use, leaving room for the epilogue


def _fits_smem(configs, named_args, **kwargs):
    """Drop configs whose pipeline stages do not fit in shared memory (operand bytes per stage:
    (BM + BN) rows x 128 codes; 1-byte FP8, 2-byte carriers on CPU smoke runs)."""
    size = named_args["a_desc"].base.element_size()
    keep = [c for c in configs
            if c.num_stages * (c.kwargs.get("BM", kwargs.get("BM", 0)) + c.kwargs["BN"]) * GROUP * size <= SMEM_BUDGET]
    return keep or configs[-1:]


_PRUNE = {"early_config_prune": _fits_smem}
_gemm_compute = triton.autotune(configs=_COMPUTE, key=["M", "N", "KB"], prune_configs_by=_PRUNE)(_block_fp8_gemm)
_gemm_stream = triton.autotune(configs=_STREAM, key=["M", "N", "KB"], reset_to_zero=["c_ptr"],
                               prune_configs_by=_PRUNE)(_block_fp8_gemm)


def run(A: torch.Tensor, As: torch.Tensor, B: torch.Tensor, Bs: torch.Tensor) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``C [M, N] = (A * As) @ (B * Bs)^T`` (see the module docstring)."""
    M, K = A.shape
    N = B.shape[0]
    if K % GROUP:
        raise ValueError(f"K={K} is not a multiple of {GROUP}")
    KB = K // GROUP
    out_dtype = torch.bfloat16 if A.dtype == torch.float8_e4m3fn else A.dtype
    A = A if A.stride(1) == 1 else A.contiguous()
    B = B if B.stride(1) == 1 else B.contiguous()
    As = As.contiguous()
    Bs = Bs.contiguous()
    c = torch.empty((M, N), dtype=out_dtype, device=A.device)
    a_desc = TensorDescriptor.from_tensor(A, [64, GROUP])
    b_desc = TensorDescriptor.from_tensor(B, [64, GROUP])
    if M > 64 and triton.cdiv(M, 128) * triton.cdiv(N, 128) >= _num_sms(A.device):
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]), 1)  # noqa: E731
        _gemm_compute[grid](a_desc, b_desc, As, Bs, c, M, N, KB, As.stride(0), Bs.stride(0), c.stride(0),
                            GROUP_M=8)
        return c
    # weight streaming: FP32 partial sums of the K splits, then one rounding pass
    bm = max(16, min(64, triton.next_power_of_2(M)))
    ws = torch.zeros((M, N), dtype=torch.float32, device=A.device)
    grid = lambda meta: (triton.cdiv(M, bm) * triton.cdiv(N, meta["BN"]), meta["SPLIT_K"])  # noqa: E731
    _gemm_stream[grid](a_desc, b_desc, As, Bs, ws, M, N, KB, As.stride(0), Bs.stride(0), ws.stride(0),
                       BM=bm, GROUP_M=1)
    n = M * N
    _round_out[(triton.cdiv(n, 4096),)](ws, c, n, BLOCK=4096)
    return c
