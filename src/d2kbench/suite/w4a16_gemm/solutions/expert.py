"""Expert Triton solution: AWQ W4A16 GEMM with conversion-free in-register dequantisation.

Contract (identical to ``reference.run``)
------------------------------------------
``run(x, qweight, qzeros, scales, group_size)``: ``x [M, K]`` fp16, ``qweight [K, N/8]`` and
``qzeros [K/G, N/8]`` AWQ-packed int32 (field ``i`` of a word = column ``AWQ_ORDER[i]`` of its
8), ``scales [K/G, N]`` fp16 -> ``y [M, N] = x @ W`` in fp16 with FP32 accumulation and
``W = fp16((q - z) * s)``.

Design
------
L1 -- the weights cross HBM once, as 4-bit codes, and are dequantised in registers.
    Decode (M = 1 .. 16) reads K N / 2 bytes of codes for 2 M N K FLOPs: pure weight
    streaming, where the dequantisation must cost only a few cheap ALU operations per weight
    or it, not HBM, becomes the limit (an int -> float conversion instruction runs at 1/8 of
    the FP32 rate on sm_90). The code becomes a float without a conversion: OR-ing a 4-bit
    value into the mantissa of the fp16 constant 1024 (bits 0x6400) gives exactly 1024 + q
    (of the FP32 constant 2^23, bits 0x4B000000, exactly 2^23 + q); the zero point is folded
    by subtracting 1024 + z (an exact fp16 integer), and one fp16 multiply by the scale rounds
    exactly as the reference's fp16(W) does. Prefill (M = 4096) is compute-bound on fp16
    tensor cores; the same dequantisation is amortised over a 256-row tile.

L2 -- a program owns an N strip and a K range; each K step stays inside one quantisation
    group (BLOCK_K divides G), so it loads one word vector of zero points and one vector of
    scales next to the [BLOCK_K, BLOCK_N / 8] packed codes (4x less traffic and staging than
    fp16 weights). The packed tile is never widened to [BLOCK_K, BLOCK_N]: field i of every
    word (bits 4i .. 4i + 3) is column AWQ_ORDER[i] of its 8, so the 8 fields are 8 weight
    tiles of the same [BLOCK_K, BLOCK_N / 8] shape as the words, each unpacked with one
    constant shift and one mask, with 8 accumulators whose columns are 8 apart in y.
    * Decode (M <= 64): one 16-64-row MMA tile covers the batch (M = 1 is padded; the tensor
      cores have time to spare), one fp16 tl.dot per field. Because every field tile has the
      shape of the word tile, the compiler stages the words (cp.async) and reads them from
      shared memory straight into the MMA operand layout: the dequantised fp16 tile never
      makes a shared-memory round trip (sm_90 compile: no shared stores in the loop).
    * _awq_gemv, an FMA GEMV for M = 1 (FP32 weights from the 2^23 trick), is kept as a
      tuning alternative; on sm_90 it issues about 2.5x the instructions per weight.
    * Decode split-K multiplies the programs until every SM streams several slices of the
      weights; each split writes its FP32 partial sums to its own slice of a [S, M, N]
      workspace (plain stores: no memset, no atomics, deterministic) and one small pass adds
      the S slices and rounds to fp16.
    * Prefill: 256 x 128 x 64 tiles (8 warps, 3 stages) in grouped order (L2 reuse of the
      packed weight panel); the taller tile amortises the unpacking over more rows. The
      dequantised fields are joined to the [BLOCK_K, BLOCK_N] MMA operand in registers.

L3 -- Weights are loaded evict-first (read once), activations stay cached. Tiles, warps,
    stages and split factors are chosen from the shape (no autotuning, so the first call is
    the steady state): decode strips of 32 words (256 columns) x 64 K rows, 4 warps, 4
    stages, with a split giving >= 4 programs per SM. _ASM = True switches the unpacking to
    inline PTX that handles a column pair per LOP3 with f16x2 arithmetic (about 20% fewer
    instructions per weight on sm_90; GPU only, the interpreter takes the Triton-op path).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

#: A plan that replaces the shape-derived one (set by tuning scripts only; None when shipped).
_FORCE: dict | None = None
#: Unpack with paired-fp16 inline PTX on the GPU (the interpreter always takes the Triton-op path).
#: On: on the H200 it took decode M=1 from 43% to 53% of SOL, M=16 from 33% to 38%, prefill
#: from 34% to 46% (results/h200/tuning/w4a16_sweep.md, every candidate checked on the GPU).
_ASM = True


def _num_sms(device: torch.device) -> int:
    """SMs of the GPU (132 on an H200); the CPU interpreter runs programs one after another,
    so a small count there keeps every path reachable on tiny shapes."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


# ---- unpacking helpers ------------------------------------------------------------------------
@triton.jit
def _f16_1024_plus(words, SH: tl.constexpr):
    """Field at bits SH .. SH + 3 of ``words`` as the fp16 value 1024 + q (OR into the mantissa
    of 1024.0 = 0x6400; integer logic only)."""
    return (((words >> SH) & 0xF) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _f32_code(words, SH: tl.constexpr):
    """Field at bits SH .. SH + 3 of ``words`` as an exact FP32 integer q (2^23 + q from the
    mantissa of 2^23 = 0x4B000000, minus 2^23: no int -> float conversion)."""
    return (((words >> SH) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _field_w16(words, zw, s_row, p_ok, SH: tl.constexpr, COL: tl.constexpr):
    """fp16 weights of field SH // 4 (column COL of each word): fp16((q - z) * s), bit-exact.
    ``words [BK, BP]``, ``zw [BP]`` packed zero points, ``s_row`` pointers to the scales of
    column 0 of each word."""
    s = tl.load(s_row + COL, mask=p_ok, other=0.0)
    return (_f16_1024_plus(words, SH) - _f16_1024_plus(zw, SH)[None, :]) * s[None, :]


@triton.jit
def _pair_w16_asm(words, zw, s32_row, p_ok, J: tl.constexpr):
    """Columns 2J and 2J + 1 of every word (fields J and 4 + J, bits 4J and 16 + 4J) as fp16
    (q - z) * s with paired fp16 instructions: one LOP3 puts both fields under 0x6400 (two
    fp16 values 1024 + q in one register), one f16x2 subtraction of the packed 1024 + z, one
    f16x2 multiply by the two adjacent scales (``s32_row``: the scales read as int32 pairs).
    GPU only (inline PTX)."""
    zz = ((zw >> (4 * J)) & 0x000F000F) | 0x64006400
    ss = tl.load(s32_row + J, mask=p_ok, other=0)
    lo, hi = tl.inline_asm_elementwise(
        asm="{.reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x64006400, 0xEA; sub.rn.f16x2 t, t, $3; "
            "mul.rn.f16x2 t, t, $4; mov.b32 {$0, $1}, t;}",
        constraints="=h,=h,r,r,r",
        args=[words >> (4 * J), tl.broadcast_to(zz[None, :], words.shape), tl.broadcast_to(ss[None, :], words.shape)],
        dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    return lo, hi


# ---- M = 1: FMA GEMV over the 8 fields --------------------------------------------------------
@triton.jit
def _gemv_field(acc, xb, words, zw, s_row, p_ok, SH: tl.constexpr, COL: tl.constexpr):
    s = tl.load(s_row + COL, mask=p_ok, other=0.0).to(tl.float32)
    zs = _f32_code(zw, SH) * s
    return acc + xb * (_f32_code(words, SH) * s[None, :] - zs[None, :])


@triton.jit
def _store_field(out, acc, offs_p, ok, COL: tl.constexpr):
    tl.store(out + offs_p * 8 + COL, tl.sum(acc, axis=0), mask=ok)


@triton.jit
def _awq_gemv(x_ptr, qw_ptr, qz_ptr, s_ptr, ws_ptr, M, N, K, stride_xm, stride_qk, stride_zg, stride_sg,
              G: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr):
    """Program (strip pid_n of BP words, split pid_k, row m): FP32 partial sums of
    y[m, 8 p + c] over its K range into ``ws[pid_k, m, :]``."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    steps = K // BK
    per = tl.cdiv(steps, SPLIT_K)
    k0 = pid_k * per * BK
    k1 = min(k0 + per * BK, K)
    offs_p = pid_n * BP + tl.arange(0, BP)
    offs_k = tl.arange(0, BK)
    p_ok = offs_p < N // 8
    w_ptrs = qw_ptr + offs_k.to(tl.int64)[:, None] * stride_qk + offs_p[None, :]
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    a0 = tl.zeros((BK, BP), dtype=tl.float32)
    a1 = tl.zeros((BK, BP), dtype=tl.float32)
    a2 = tl.zeros((BK, BP), dtype=tl.float32)
    a3 = tl.zeros((BK, BP), dtype=tl.float32)
    a4 = tl.zeros((BK, BP), dtype=tl.float32)
    a5 = tl.zeros((BK, BP), dtype=tl.float32)
    a6 = tl.zeros((BK, BP), dtype=tl.float32)
    a7 = tl.zeros((BK, BP), dtype=tl.float32)
    for k in range(k0, k1, BK):
        g = k // G
        words = tl.load(w_ptrs + k * stride_qk, mask=p_ok[None, :], other=0, eviction_policy="evict_first")
        xb = tl.load(x_row + k + offs_k).to(tl.float32)[:, None]
        zw = tl.load(qz_ptr + g * stride_zg + offs_p, mask=p_ok, other=0)
        s_row = s_ptr + g * stride_sg + offs_p * 8
        a0 = _gemv_field(a0, xb, words, zw, s_row, p_ok, 0, 0)        # field i holds column AWQ_ORDER[i]
        a1 = _gemv_field(a1, xb, words, zw, s_row, p_ok, 4, 2)
        a2 = _gemv_field(a2, xb, words, zw, s_row, p_ok, 8, 4)
        a3 = _gemv_field(a3, xb, words, zw, s_row, p_ok, 12, 6)
        a4 = _gemv_field(a4, xb, words, zw, s_row, p_ok, 16, 1)
        a5 = _gemv_field(a5, xb, words, zw, s_row, p_ok, 20, 3)
        a6 = _gemv_field(a6, xb, words, zw, s_row, p_ok, 24, 5)
        a7 = _gemv_field(a7, xb, words, zw, s_row, p_ok, 28, 7)
    out = ws_ptr + (pid_k * M + m).to(tl.int64) * N
    _store_field(out, a0, offs_p, p_ok, 0)
    _store_field(out, a1, offs_p, p_ok, 2)
    _store_field(out, a2, offs_p, p_ok, 4)
    _store_field(out, a3, offs_p, p_ok, 6)
    _store_field(out, a4, offs_p, p_ok, 1)
    _store_field(out, a5, offs_p, p_ok, 3)
    _store_field(out, a6, offs_p, p_ok, 5)
    _store_field(out, a7, offs_p, p_ok, 7)


# ---- M = 2 .. 64: one fp16 MMA per field ------------------------------------------------------
@triton.jit
def _store_mma_field(out, stride_om, acc, offs_m, offs_p, ok, COL: tl.constexpr):
    ptrs = out + offs_m.to(tl.int64)[:, None] * stride_om + (offs_p * 8 + COL)[None, :]
    tl.store(ptrs, acc.to(out.dtype.element_ty), mask=ok)


@triton.jit
def _awq_fields_mma(x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_qk, stride_zg, stride_sg,
                    stride_om, split_stride,
                    G: tl.constexpr, BM: tl.constexpr, BP: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                    ASM: tl.constexpr):
    """Program (m tile, strip of BP words, split pid_k): 8 products x [BM, BK] @ W_field [BK, BP]
    (FP32 accumulators), written to ``out + pid_k * split_stride`` (y itself when SPLIT_K = 1).
    ASM: paired-fp16 inline-PTX unpacking, ``s_ptr`` then the scales as int32 pairs."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    steps = K // BK
    per = tl.cdiv(steps, SPLIT_K)
    k0 = pid_k * per * BK
    k1 = min(k0 + per * BK, K)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_p = pid_n * BP + tl.arange(0, BP)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    p_ok = offs_p < N // 8
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = qw_ptr + offs_k.to(tl.int64)[:, None] * stride_qk + offs_p[None, :]
    a0 = tl.zeros((BM, BP), dtype=tl.float32)
    a1 = tl.zeros((BM, BP), dtype=tl.float32)
    a2 = tl.zeros((BM, BP), dtype=tl.float32)
    a3 = tl.zeros((BM, BP), dtype=tl.float32)
    a4 = tl.zeros((BM, BP), dtype=tl.float32)
    a5 = tl.zeros((BM, BP), dtype=tl.float32)
    a6 = tl.zeros((BM, BP), dtype=tl.float32)
    a7 = tl.zeros((BM, BP), dtype=tl.float32)
    for k in range(k0, k1, BK):
        g = k // G
        x = tl.load(x_ptrs + k, mask=m_ok[:, None], other=0.0)
        words = tl.load(w_ptrs + k * stride_qk, mask=p_ok[None, :], other=0, eviction_policy="evict_first")
        zw = tl.load(qz_ptr + g * stride_zg + offs_p, mask=p_ok, other=0)
        if ASM:
            s32_row = s_ptr + g * stride_sg + offs_p * 4
            w0, w4 = _pair_w16_asm(words, zw, s32_row, p_ok, 0)
            w1, w5 = _pair_w16_asm(words, zw, s32_row, p_ok, 1)
            w2, w6 = _pair_w16_asm(words, zw, s32_row, p_ok, 2)
            w3, w7 = _pair_w16_asm(words, zw, s32_row, p_ok, 3)
        else:
            s_row = s_ptr + g * stride_sg + offs_p * 8
            w0 = _field_w16(words, zw, s_row, p_ok, 0, 0)        # field i holds column AWQ_ORDER[i]
            w1 = _field_w16(words, zw, s_row, p_ok, 4, 2)
            w2 = _field_w16(words, zw, s_row, p_ok, 8, 4)
            w3 = _field_w16(words, zw, s_row, p_ok, 12, 6)
            w4 = _field_w16(words, zw, s_row, p_ok, 16, 1)
            w5 = _field_w16(words, zw, s_row, p_ok, 20, 3)
            w6 = _field_w16(words, zw, s_row, p_ok, 24, 5)
            w7 = _field_w16(words, zw, s_row, p_ok, 28, 7)
        a0 = tl.dot(x, w0, a0)
        a1 = tl.dot(x, w1, a1)
        a2 = tl.dot(x, w2, a2)
        a3 = tl.dot(x, w3, a3)
        a4 = tl.dot(x, w4, a4)
        a5 = tl.dot(x, w5, a5)
        a6 = tl.dot(x, w6, a6)
        a7 = tl.dot(x, w7, a7)
    out = out_ptr + pid_k.to(tl.int64) * split_stride
    ok = m_ok[:, None] & p_ok[None, :]
    _store_mma_field(out, stride_om, a0, offs_m, offs_p, ok, 0)
    _store_mma_field(out, stride_om, a1, offs_m, offs_p, ok, 2)
    _store_mma_field(out, stride_om, a2, offs_m, offs_p, ok, 4)
    _store_mma_field(out, stride_om, a3, offs_m, offs_p, ok, 6)
    _store_mma_field(out, stride_om, a4, offs_m, offs_p, ok, 1)
    _store_mma_field(out, stride_om, a5, offs_m, offs_p, ok, 3)
    _store_mma_field(out, stride_om, a6, offs_m, offs_p, ok, 5)
    _store_mma_field(out, stride_om, a7, offs_m, offs_p, ok, 7)


# ---- prefill (and the widened-tile decode variant): [BK, BN] operand from joined fields --------
@triton.jit
def _awq_gemm(x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_qk, stride_zg, stride_sg,
              stride_om, split_stride,
              G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
              SPLIT_K: tl.constexpr, ASM: tl.constexpr):
    """One program: output tile (pid_m, pid_n) over the K range of split pid_k (in BK steps),
    written to ``out + pid_k * split_stride``. The 8 dequantised fields [BK, BN / 8] are joined
    into the natural column order: column 4a + 2b + d of a word is field AWQ_INV[4a + 2b + d],
    i.e. field (2a + b) + 4d (AWQ puts columns 2j and 2j + 1 in fields j and 4 + j)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % rows
    pid_n = (pid % width) // rows
    steps = K // BK
    per = tl.cdiv(steps, SPLIT_K)
    k0 = pid_k * per * BK
    k1 = min(k0 + per * BK, K)

    BP: tl.constexpr = BN // 8
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_p = pid_n * BP + tl.arange(0, BP)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    n_ok = offs_n < N
    p_ok = offs_p < N // 8
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = qw_ptr + offs_k.to(tl.int64)[:, None] * stride_qk + offs_p[None, :]

    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(k0, k1, BK):
        g = k // G
        x = tl.load(x_ptrs + k, mask=m_ok[:, None], other=0.0)
        words = tl.load(w_ptrs + k * stride_qk, mask=p_ok[None, :], other=0, eviction_policy="evict_first")
        zw = tl.load(qz_ptr + g * stride_zg + offs_p, mask=p_ok, other=0)
        if ASM:
            s32_row = s_ptr + g * stride_sg + offs_p * 4
            c0, c1 = _pair_w16_asm(words, zw, s32_row, p_ok, 0)
            c2, c3 = _pair_w16_asm(words, zw, s32_row, p_ok, 1)
            c4, c5 = _pair_w16_asm(words, zw, s32_row, p_ok, 2)
            c6, c7 = _pair_w16_asm(words, zw, s32_row, p_ok, 3)
        else:
            s_row = s_ptr + g * stride_sg + offs_p * 8
            c0 = _field_w16(words, zw, s_row, p_ok, 0, 0)
            c1 = _field_w16(words, zw, s_row, p_ok, 16, 1)
            c2 = _field_w16(words, zw, s_row, p_ok, 4, 2)
            c3 = _field_w16(words, zw, s_row, p_ok, 20, 3)
            c4 = _field_w16(words, zw, s_row, p_ok, 8, 4)
            c5 = _field_w16(words, zw, s_row, p_ok, 24, 5)
            c6 = _field_w16(words, zw, s_row, p_ok, 12, 6)
            c7 = _field_w16(words, zw, s_row, p_ok, 28, 7)
        # [BK, BP, a, b, d] with column 4a + 2b + d: the first join makes the slowest axis
        t = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
        w = tl.reshape(t, (BK, BN))
        acc = tl.dot(x, w, acc)

    c_ptrs = out_ptr + pid_k.to(tl.int64) * split_stride + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(c_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_splits(ws_ptr, c_ptr, n, S: tl.constexpr, BLOCK: tl.constexpr):
    """y = fp16(sum over the S FP32 partial-sum slices of ws [S, n])."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(ws_ptr + s * n + offs, mask=ok, other=0.0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=ok)


# ---- plans ------------------------------------------------------------------------------------
def _split_for(programs: int, steps: int, sms: int, per_sm: int, cap: int) -> int:
    """Smallest power-of-two split giving >= per_sm programs per SM (at most cap, and at least
    two K steps per split)."""
    s = 1
    while programs * s < per_sm * sms and s < cap and steps // (2 * s) >= 2:
        s *= 2
    return s


def _plan(M: int, N: int, K: int, G: int, sms: int) -> dict:
    """Kernel and launch parameters from the shape (deterministic; the H200 choices)."""
    if _FORCE is not None:
        return dict(_FORCE)
    if M > 64 and triton.cdiv(M, 256) * triton.cdiv(N, 128) >= sms:
        bm = 64 if _INTERPRET else 256          # same code, a tile the CPU interpreter runs quickly
        return dict(kind="gemm", BM=bm, BN=128, BK=64, S=1, warps=8, stages=3, GROUP_M=8)
    bm = max(16, min(64, triton.next_power_of_2(M)))
    bp, bk = 32, 64
    strips = triton.cdiv(N // 8, bp) * triton.cdiv(M, bm)
    return dict(kind="fields", BM=bm, BP=bp, BK=bk, S=_split_for(strips, K // bk, sms, 4, 16), warps=4, stages=4)


def run(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
        group_size: int) -> torch.Tensor:
    """AWQ W4A16 GEMM ``y [M, N] = x @ W`` (see the module docstring).

    Raises:
        ValueError: K not a multiple of G, G not a multiple of 64, or N not a multiple of 8.
    """
    M, K = x.shape
    N = scales.shape[1]
    G = group_size
    if K % G or G % 64 or N % 8:
        raise ValueError(f"need K % G == 0, G % 64 == 0, N % 8 == 0 (K={K}, G={G}, N={N})")
    x, qweight, qzeros, scales = x.contiguous(), qweight.contiguous(), qzeros.contiguous(), scales.contiguous()
    y = torch.empty((M, N), dtype=torch.float16, device=x.device)
    p = _plan(M, N, K, G, _num_sms(x.device))
    S = p["S"]
    ws = y if S == 1 else torch.empty((S, M, N), dtype=torch.float32, device=x.device)
    asm = p.get("asm", _ASM) and not _INTERPRET and p["kind"] != "gemv"
    s_arg = scales.view(torch.int32) if asm else scales          # adjacent column pairs as one word
    strides = (x.stride(0), qweight.stride(0), qzeros.stride(0), s_arg.stride(0))
    opts = dict(num_warps=p["warps"], num_stages=p["stages"])
    if p["kind"] == "gemm":
        grid = (triton.cdiv(M, p["BM"]) * triton.cdiv(N, p["BN"]), S)
        _awq_gemm[grid](x, qweight, qzeros, s_arg, ws, M, N, K, *strides, N, M * N, G=G, BM=p["BM"], BN=p["BN"],
                        BK=p["BK"], GROUP_M=p["GROUP_M"], SPLIT_K=S, ASM=asm, **opts)
    elif p["kind"] == "fields":
        grid = (triton.cdiv(N // 8, p["BP"]), S, triton.cdiv(M, p["BM"]))
        _awq_fields_mma[grid](x, qweight, qzeros, s_arg, ws, M, N, K, *strides, N, M * N, G=G, BM=p["BM"],
                              BP=p["BP"], BK=p["BK"], SPLIT_K=S, ASM=asm, **opts)
    elif p["kind"] == "gemv":
        if S == 1:
            ws = torch.empty((1, M, N), dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(N // 8, p["BP"]), S, M)
        _awq_gemv[grid](x, qweight, qzeros, scales, ws, M, N, K, *strides, G=G, BP=p["BP"], BK=p["BK"],
                        SPLIT_K=S, **opts)
    else:
        raise ValueError(f"unknown kernel kind {p['kind']!r}")
    if ws is not y:
        n = M * N
        _sum_splits[(triton.cdiv(n, 2048),)](ws, y, n, S=ws.shape[0], BLOCK=2048)
    return y
