"""Muon orthogonalisation, straightforward Triton port (no expert design).

A competent direct translation of the step-wise recurrence: per step three batched Triton
GEMMs on the rectangular iterate (A = X X^T, B = c A A + b A, X = B X + a X) with the
scale-add fused into each GEMM's epilogue. No Gram-side composition, no restart, no symmetric
products. Shapes: G [B, M, N] bfloat16 -> out [B, M, N] bfloat16.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _gemm_configs():
    if _INTERPRET:
        return [triton.Config({"BM": 32, "BN": 32, "BK": 32, "GROUP": 4}, num_warps=1, num_stages=1)]
    return [
        triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3),
        triton.Config({"BM": 128, "BN": 256, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3),
        triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=4, num_stages=4),
    ]


@triton.autotune(configs=_gemm_configs(), key=["M", "N", "K"])
@triton.jit
def _bgemm_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K,
                  sab, sam, sak, sbb, sbk, sbn, scb, scm, scn, sob, som, son,
                  alpha, beta, HAS_C: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """out[b] = alpha * A[b] @ B[b] (+ beta * C[b]); fp16 (or bf16) operands, fp32 accumulation."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    group = pid // (GROUP * num_n)
    first_m = group * GROUP
    size_m = tl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (pid % size_m)
    pid_n = (pid % (GROUP * num_n)) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_base = a_ptr + batch * sab
    b_base = b_ptr + batch * sbb
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_base + rm[:, None] * sam + kk[None, :] * sak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_base + kk[:, None] * sbk + rn[None, :] * sbn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    acc = acc * alpha
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_C:
        c = tl.load(c_ptr + batch * scb + rm[:, None] * scm + rn[None, :] * scn, mask=mask, other=0.0)
        acc += beta * c.to(tl.float32)
    tl.store(out_ptr + batch * sob + rm[:, None] * som + rn[None, :] * son,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


def _bgemm(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0, c: torch.Tensor | None = None,
           beta: float = 0.0) -> torch.Tensor:
    """Batched ``alpha * a @ b + beta * c`` for [B, M, K] x [B, K, N] views (any strides), in a's dtype."""
    Bsz, M, K = a.shape
    N = b.shape[2]
    out = torch.empty((Bsz, M, N), device=a.device, dtype=a.dtype)
    cc = c if c is not None else out
    grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]), Bsz)  # noqa: E731
    _bgemm_kernel[grid](a, b, cc, out, M, N, K,
                        a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
                        cc.stride(0), cc.stride(1), cc.stride(2), out.stride(0), out.stride(1), out.stride(2),
                        alpha, beta, HAS_C=c is not None)
    return out


@triton.jit
def _sumsq_kernel(g_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """out[b] += sum(G[b]^2) in fp32; grid (chunks, B)."""
    batch = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(g_ptr + batch * numel + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + batch, tl.sum(x * x, axis=0))


@triton.jit
def _scale_cast_kernel(g_ptr, ss_ptr, x_ptr, R, C, sgb, sgr, sgc, norm_scale, BR: tl.constexpr, BC: tl.constexpr):
    """X[b] = G[b] / (sqrt(ss[b]) * norm_scale + 1e-6) in X's dtype; G read through strides."""
    batch = tl.program_id(2).to(tl.int64)
    rr = tl.program_id(0) * BR + tl.arange(0, BR)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    mask = (rr[:, None] < R) & (rc[None, :] < C)
    g = tl.load(g_ptr + batch * sgb + rr[:, None] * sgr + rc[None, :] * sgc, mask=mask, other=0.0).to(tl.float32)
    scale = 1.0 / (tl.sqrt(tl.load(ss_ptr + batch)) * norm_scale + 1e-6)
    tl.store(x_ptr + batch * R * C + rr[:, None] * C + rc[None, :], (g * scale).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _to_bf16_kernel(x_ptr, o_ptr, R, C, sob, sor, soc, BR: tl.constexpr, BC: tl.constexpr):
    """out (strided view) = bf16(X[b]) for contiguous fp16 X [B, R, C]."""
    batch = tl.program_id(2).to(tl.int64)
    rr = tl.program_id(0) * BR + tl.arange(0, BR)
    rc = tl.program_id(1) * BC + tl.arange(0, BC)
    mask = (rr[:, None] < R) & (rc[None, :] < C)
    x = tl.load(x_ptr + batch * R * C + rr[:, None] * C + rc[None, :], mask=mask, other=0.0)
    tl.store(o_ptr + batch * sob + rr[:, None] * sor + rc[None, :] * soc, x.to(tl.bfloat16), mask=mask)


def run(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Muon orthogonalisation. G: [B, M, N] bfloat16 -> [B, M, N] bfloat16 (new tensor).

    Raises:
        ValueError: ``steps != 5`` or ``G`` not 3-D bfloat16.
    """
    if steps != 5:
        raise ValueError(f"steps must equal 5 (got {steps})")
    return polar_express(G, COEFFS)


def polar_express(G: torch.Tensor, coeffs, iterate_dtype: torch.dtype = torch.float16,
                  norm_scale: float = 1.02) -> torch.Tensor:
    """The step-wise recurrence for any coefficient list, iterate dtype and norm scale.

    ``run`` uses exactly the task's definition; the other parameters exist so that tests can
    build the wrong variants the tolerance must reject (fewer steps, BF16 iterate, ...).
    """
    if G.dim() != 3 or G.dtype != torch.bfloat16:
        raise ValueError("G must be a [B, M, N] bfloat16 tensor")
    G = G.contiguous()
    Bsz, M, N = G.shape
    tall = M > N
    Gv = G.mT if tall else G          # wide view: [B, R, C] with R <= C
    R, C = Gv.shape[1], Gv.shape[2]
    blk = 32 if _INTERPRET else 64
    sumsq = torch.zeros(Bsz, device=G.device, dtype=torch.float32)
    numel = M * N
    chunk = 1024 if _INTERPRET else 8192
    _sumsq_kernel[(triton.cdiv(numel, chunk), Bsz)](G, sumsq, numel, BLOCK=chunk)
    X = torch.empty((Bsz, R, C), device=G.device, dtype=iterate_dtype)
    grid2 = (triton.cdiv(R, blk), triton.cdiv(C, blk), Bsz)
    _scale_cast_kernel[grid2](Gv, sumsq, X, R, C, Gv.stride(0), Gv.stride(1), Gv.stride(2), norm_scale,
                              BR=blk, BC=blk)
    for a, b, c in coeffs:
        A = _bgemm(X, X.mT)                      # A = X X^T            [B, R, R]
        Bm = _bgemm(A, A, alpha=c, c=A, beta=b)  # B = c A A + b A      [B, R, R]
        X = _bgemm(Bm, X, alpha=1.0, c=X, beta=a)  # X = B X + a X      [B, R, C]
    out = torch.empty((Bsz, M, N), device=G.device, dtype=torch.bfloat16)
    ov = out.mT if tall else out
    _to_bf16_kernel[grid2](X, ov, R, C, ov.stride(0), ov.stride(1), ov.stride(2), BR=blk, BC=blk)
    return out
